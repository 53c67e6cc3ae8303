// The profile viewer: the list of profiles, one profile (timeline with server-side
// level of detail, summary, tables) and the comparison of two.

import { el, getJSON, fitCanvas, colorOf, ns, seconds, si, short, bytes, percent, thousands, sortableTable, figure, niceStep, NA } from './common.js';

const LABELS = 150;
const ROW = 16;
const AXIS = 22;
const MAX_DEPTH = 6;

const api = (name) => `/api/profiles/${encodeURIComponent(name)}`;

export function profilesPage(main) {
  const list = el('div', {}, el('div', { class: 'muted' }, 'Loading…'));
  main.append(el('h2', {}, 'Profiles'), list);
  Promise.all([getJSON('/api/info'), getJSON('/api/profiles')]).then(([info, profiles]) => {
    if (!info.profiles_dir) {
      list.replaceChildren(el('div', { class: 'empty' }, 'No profiles directory: start the dashboard with --profiles DIR (NTFF files from neuron-profile capture or inspect).'));
      return;
    }
    if (profiles.length === 0) {
      list.replaceChildren(el('div', { class: 'empty' }, `No .ntff files in ${info.profiles_dir}.`));
      return;
    }
    const chosen = [];
    const compare = el('button', { id: 'compare', disabled: '', onclick: () => { location.hash = `#/compare/${encodeURIComponent(chosen[0])}/${encodeURIComponent(chosen[1])}`; } }, 'Compare the two selected');
    const rows = profiles.map((p) => {
      const box = el('input', { type: 'checkbox', dataset: { name: p.name }, onchange: () => {
        if (box.checked) chosen.push(p.name);
        else if (chosen.includes(p.name)) chosen.splice(chosen.indexOf(p.name), 1);
        // Two at most: the oldest choice is unticked.
        while (chosen.length > 2) {
          const first = chosen.shift();
          for (const other of list.querySelectorAll('input[type=checkbox]')) if (other.dataset.name === first) other.checked = false;
        }
        if (chosen.length === 2) compare.removeAttribute('disabled'); else compare.setAttribute('disabled', '');
      } });
      return el('tr', {}, el('td', {}, box, ' ', el('a', { href: `#/profile/${encodeURIComponent(p.name)}`, class: 'profile-link' }, p.name)),
        el('td', {}, bytes(p.bytes)), el('td', {}, new Date(p.modified * 1000).toLocaleString()),
        el('td', {}, el('a', { href: `${api(p.name)}/perfetto`, download: '' }, 'Perfetto trace')));
    });
    // A job's rank profiles (profile_rank_<id>.ntff) also open together.
    const ranks = profiles.filter((p) => /^profile_rank_\d+\.ntff$/.test(p.name));
    const job = ranks.length > 1 ? [el('div', { class: 'toolbar' }, el('a', { href: '#/job', id: 'job-link' }, `The ${ranks.length} rank profiles of the job on one timeline`))] : [];
    list.replaceChildren(el('div', { class: 'muted' }, info.profiles_dir), ...job,
      el('table', {}, el('tr', {}, ['profile', 'size', 'modified', 'export'].map((h) => el('th', {}, h))), rows),
      el('div', { class: 'toolbar' }, compare));
  }).catch((e) => list.replaceChildren(el('div', { class: 'error' }, e.message)));
  return {};
}

// `base`: the API of what is shown when it is not one profile of the directory (the
// job's ranks together, '/api/job').
export function profilePage(main, name, base = null) {
  const url = base || api(name);
  const status = document.getElementById('status');
  const head = el('div', {}, el('h2', {}, name), el('div', { class: 'muted' }, 'Opening…'));
  const range = el('span', { class: 'muted', id: 'pf-range' });
  const canvas = el('canvas', { id: 'pf-canvas', tabindex: '0' });
  const details = el('div', { class: 'details', id: 'pf-details' }, el('div', { class: 'muted' }, 'Click a span for its details.'));
  const search = el('input', { id: 'pf-search', type: 'search', placeholder: 'search: opcode, event, DMA queue', oninput: () => { state.query = search.value.trim().toLowerCase(); draw(); } });
  const summary = el('div', { id: 'pf-summary' }, el('div', { class: 'muted' }, 'The summary follows the timeline…'));
  const tables = el('div', { id: 'pf-tables' });
  const state = { meta: null, t0: 0, t1: 1, data: null, views: 0, controller: null, timer: 0, selected: null, rows: [], asked: null, stopped: false, query: '' };
  const zoom = (factor, at = 0.5) => {
    if (!state.meta) return;
    const span = state.t1 - state.t0, full = state.meta.duration_ns || 1;
    const next = Math.min(full, Math.max(1000, span * factor));
    let t0 = state.t0 + (span - next) * at;
    t0 = Math.max(0, Math.min(t0, full - next));
    setRange(t0, t0 + next);
  };
  const pan = (fraction) => {
    if (!state.meta) return;
    const span = state.t1 - state.t0, full = state.meta.duration_ns || 1;
    const t0 = Math.max(0, Math.min(state.t0 + span * fraction, full - span));
    setRange(t0, t0 + span);
  };
  const toolbar = el('div', { class: 'toolbar' },
    el('button', { onclick: () => zoom(0.5), id: 'pf-zoom-in' }, 'Zoom in'),
    el('button', { onclick: () => zoom(2) }, 'Zoom out'),
    el('button', { onclick: () => state.meta && setRange(0, state.meta.duration_ns) }, 'Whole profile'),
    search, range, el('span', { class: 'grow' }),
    el('a', { href: `${url}/perfetto`, download: '', id: 'pf-perfetto' }, 'Download Perfetto trace'));
  const keys = el('div', { class: 'muted keys' }, 'Keys (click the timeline first): W / S zoom in and out · A / D pan · wheel zooms at the pointer, drag pans · / search. Spans that do not match the search are dimmed.');
  main.append(head, toolbar, keys, el('div', { class: 'split' }, el('div', { class: 'timeline' }, canvas), el('div', { class: 'card' }, el('h3', {}, 'Span'), details)),
    el('div', { class: 'card' }, el('h2', {}, 'Summary'), summary), tables);

  function setRange(t0, t1) {
    state.t0 = t0; state.t1 = t1;
    // From the first input of a gesture to the view drawn for it.
    if (state.asked === null) state.asked = performance.now();
    draw();
    clearTimeout(state.timer);
    state.timer = setTimeout(fetchView, 15);
  }

  async function fetchView() {
    if (state.stopped) return;
    if (state.controller) state.controller.abort();
    const controller = new AbortController();
    state.controller = controller;
    const columns = Math.max(1, Math.floor(canvas.clientWidth - LABELS));
    const t0 = Math.floor(state.t0), t1 = Math.ceil(state.t1);
    const started = performance.now();
    try {
      const view = await getJSON(`${url}/view?t0=${t0}&t1=${t1}&columns=${columns}`, { signal: controller.signal });
      if (state.stopped) return;
      state.data = view;
      state.views++;
      canvas.dataset.views = state.views;
      canvas.dataset.lastViewMs = (performance.now() - started).toFixed(1);
      draw();
      if (state.asked !== null) {
        canvas.dataset.lastAnswerMs = (performance.now() - state.asked).toFixed(1);
        state.asked = null;
      }
      status.textContent = `view in ${(performance.now() - started).toFixed(0)} ms`;
    } catch (e) {
      if (e.name !== 'AbortError') status.textContent = `view failed: ${e.message}`;
    }
  }

  function layoutRows() {
    let y = AXIS;
    state.rows = state.meta.tracks.map((t, i) => {
      const depth = Math.min(MAX_DEPTH, t.depth);
      const row = { i, y, height: depth * ROW + 2, track: t };
      y += row.height;
      return row;
    });
    return y + 4;
  }

  function draw() {
    if (!state.meta) return;
    const height = layoutRows();
    const { ctx, width } = fitCanvas(canvas, height);
    ctx.clearRect(0, 0, width, height);
    const w = width - LABELS, span = state.t1 - state.t0;
    const x = (t) => LABELS + ((t - state.t0) / span) * w;
    ctx.font = '11px system-ui';
    for (const r of state.rows) {
      ctx.fillStyle = r.i % 2 ? '#161b22' : '#1b2129';
      ctx.fillRect(0, r.y, width, r.height);
      ctx.fillStyle = '#8b949e'; ctx.textAlign = 'left';
      ctx.fillText(r.track.name, 6, r.y + 12, LABELS - 10);
    }
    const view = state.data;
    let matches = 0;
    if (view) {
      for (const tv of view.tracks) {
        const r = state.rows[tv.track];
        if (!r) continue;
        if (tv.mode === 'raw') {
          for (const [start, dur, label, depth, k] of tv.spans) {
            if (depth >= MAX_DEPTH) continue;
            const x0 = Math.max(LABELS, x(start)), x1 = Math.min(width, x(start + dur));
            if (x1 < LABELS || x0 > width) continue;
            const y = r.y + 1 + depth * ROW;
            const name = view.labels[label] ?? '';
            const selected = state.selected && state.selected.track === tv.track && state.selected.index === k;
            const hit = !state.query || name.toLowerCase().includes(state.query);
            if (state.query && hit) matches++;
            ctx.globalAlpha = hit ? 1 : 0.15;
            ctx.fillStyle = selected ? '#ffffff' : colorOf(name);
            ctx.fillRect(x0, y, Math.max(1, x1 - x0), ROW - 2);
            if (x1 - x0 > 36) { ctx.fillStyle = '#0d1117'; ctx.fillText(name, x0 + 3, y + 11, x1 - x0 - 6); }
            ctx.globalAlpha = 1;
          }
        } else {
          // One bin per pixel column of the view it was made for, mapped to this view.
          const cw = (view.t1 - view.t0) / view.columns;
          for (const [c, permille, , label] of tv.bins) {
            const a = view.t0 + c * cw;
            const x0 = Math.max(LABELS, x(a)), x1 = Math.min(width, x(a + cw));
            if (x1 < LABELS || x0 > width) continue;
            const full = r.height - 2, h = Math.max(2, (full * permille) / 1000);
            const name = view.labels[label] ?? '';
            ctx.globalAlpha = !state.query || name.toLowerCase().includes(state.query) ? 1 : 0.15;
            ctx.fillStyle = colorOf(name);
            ctx.fillRect(x0, r.y + 1 + full - h, Math.max(1, x1 - x0), h);
            ctx.globalAlpha = 1;
          }
        }
      }
    }
    // A job's collectives: a line from each rank's part to the next rank's to arrive,
    // with a head at the later one.
    let flows = 0;
    for (const flow of (view && view.flows) || []) {
      const points = flow.map(([track, start]) => state.rows[track] && [x(start), state.rows[track].y + ROW / 2]).filter(Boolean);
      if (points.length < 2) continue;
      flows++;
      ctx.strokeStyle = '#f0f6fc'; ctx.fillStyle = '#f0f6fc'; ctx.globalAlpha = 0.7; ctx.lineWidth = 1;
      for (let k = 1; k < points.length; k++) {
        const [[x0, y0], [x1, y1]] = [points[k - 1], points[k]];
        if (Math.max(x0, x1) < LABELS || Math.min(x0, x1) > width) continue;
        ctx.beginPath(); ctx.moveTo(Math.max(LABELS, x0), y0); ctx.lineTo(x1, y1); ctx.stroke();
        const angle = Math.atan2(y1 - y0, x1 - x0);
        ctx.beginPath(); ctx.moveTo(x1, y1);
        ctx.lineTo(x1 - 6 * Math.cos(angle - 0.4), y1 - 6 * Math.sin(angle - 0.4));
        ctx.lineTo(x1 - 6 * Math.cos(angle + 0.4), y1 - 6 * Math.sin(angle + 0.4));
        ctx.fill();
      }
      ctx.globalAlpha = 1;
    }
    canvas.dataset.flows = flows;
    // Round ticks: multiples of a 1, 2 or 5 step from the profile's start.
    ctx.fillStyle = '#8b949e'; ctx.textAlign = 'center';
    const step = niceStep(span, 6);
    const ticks = [];
    for (let t = Math.ceil(state.t0 / step) * step; t <= state.t1; t += step) ticks.push(t);
    for (const t of ticks) {
      if (x(t) < LABELS + 24 || x(t) > width - 24) continue;
      ctx.fillText(ns(t).replace(/\.0+ /, ' ').replace(/(\.\d*?)0+ /, '$1 '), x(t), 14);
      ctx.fillRect(x(t), 17, 1, 4);
    }
    canvas.dataset.ticks = JSON.stringify(ticks);
    canvas.dataset.matches = matches;
    const left = view && view.flows_left_out ? ` · ${thousands(view.flows_left_out)} collectives here: zoom in for their arrows` : '';
    range.textContent = `${ns(state.t0)} – ${ns(state.t1)} (${ns(span)} shown of ${ns(state.meta.duration_ns)})${left}`;
  }

  canvas.addEventListener('wheel', (e) => {
    if (!state.meta) return;
    e.preventDefault();
    const at = Math.min(1, Math.max(0, (e.offsetX - LABELS) / (canvas.clientWidth - LABELS)));
    if (Math.abs(e.deltaX) > Math.abs(e.deltaY)) pan(e.deltaX / 500);
    else zoom(Math.exp(e.deltaY / 300), at);
  }, { passive: false });
  let drag = null;
  canvas.addEventListener('mousedown', (e) => { drag = { x: e.offsetX, t0: state.t0, moved: false }; });
  const onMouseUp = () => { setTimeout(() => { drag = null; }, 0); };
  window.addEventListener('mouseup', onMouseUp);
  canvas.addEventListener('mousemove', (e) => {
    if (!drag || !(e.buttons & 1) || !state.meta) return;
    const dx = e.offsetX - drag.x;
    if (Math.abs(dx) > 2) drag.moved = true;
    const span = state.t1 - state.t0, full = state.meta.duration_ns;
    const t0 = Math.max(0, Math.min(drag.t0 - (dx / (canvas.clientWidth - LABELS)) * span, full - span));
    setRange(t0, t0 + span);
  });
  canvas.addEventListener('keydown', (e) => {
    const keys = { w: () => zoom(0.7), s: () => zoom(1 / 0.7), a: () => pan(-0.2), d: () => pan(0.2), '/': () => search.focus() };
    if (keys[e.key] && state.meta) { keys[e.key](); e.preventDefault(); }
  });
  canvas.addEventListener('click', async (e) => {
    if (!state.data || (drag && drag.moved)) return;
    const row = state.rows.find((r) => e.offsetY >= r.y && e.offsetY < r.y + r.height);
    if (!row) return;
    const tv = state.data.tracks.find((t) => t.track === row.i);
    const span = state.t1 - state.t0, w = canvas.clientWidth - LABELS;
    const t = state.t0 + ((e.offsetX - LABELS) / w) * span, slack = (3 / w) * span;
    if (!tv || tv.mode !== 'raw') {
      details.replaceChildren(el('div', { class: 'muted' }, 'Zoom in to pick a single span: this track is drawn as busy time per pixel here.'));
      return;
    }
    const depth = Math.floor((e.offsetY - row.y - 1) / ROW);
    const hit = tv.spans.filter(([s, d, , dp]) => dp === depth && s - slack <= t && s + d + slack >= t)
      .sort((p, q) => p[1] - q[1])[0];
    if (!hit) return;
    showSpan(row.i, hit[4]);
  });

  // The details pane: the span's fields as a table, times for people, the model by
  // name, its place in its execution, and a link to that execution.
  async function showSpan(track, index) {
    state.selected = { track, index };
    draw();
    try {
      const d = await getJSON(`${url}/span?track=${track}&index=${index}`);
      const rows = [['name', d.name ?? ''], ['track', d.track], ['start', `${ns(d.start_ns)} into the profile`], ['duration', ns(d.duration_ns)]];
      if (d.execution) rows.push(['in execution', `${d.execution.exec_id}, ${ns(d.execution.offset_ns)} after it started`]);
      if (d.model) rows.push(['model', d.model]);
      const shown = new Set(['name', 'track', 'start_ns', 'duration_ns', 'execution', 'model', 'model_id', 'args']);
      for (const [k, v] of Object.entries(d)) {
        if (shown.has(k) || v === null || v === undefined) continue;
        const text = k === 'flops' ? si(v) : k.startsWith('bytes') ? bytes(v) : String(v);
        rows.push([k.replaceAll('_', ' '), text]);
      }
      if (d.model_id !== undefined && d.model_id !== null && !d.model) rows.push(['model id', String(d.model_id)]);
      for (const [k, v] of Object.entries(d.args || {})) rows.push([k.replaceAll('_', ' '), String(v)]);
      if (d.flops && d.duration_ns) rows.push(['FLOP/s', si(d.flops / (d.duration_ns / 1e9), 'FLOP/s')]);
      const links = [];
      if (d.execution) links.push(el('a', { href: '#', onclick: (e) => { e.preventDefault(); showSpan(d.execution.track, d.execution.index); } }, `its execution (${d.execution.exec_id})`));
      if (d.hlo) links.push(el('a', { href: '#', onclick: (e) => { e.preventDefault(); search.value = d.name; state.query = d.name.toLowerCase(); draw(); } }, `every ${d.name} span`));
      details.replaceChildren(
        el('table', { class: 'fields' }, el('tbody', {}, ...rows.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, v))))),
        ...(links.length ? [el('div', { class: 'links' }, 'Show: ', ...links.flatMap((a, i) => (i ? [' · ', a] : [a])))] : []),
      );
    } catch (err) { details.replaceChildren(el('div', { class: 'error' }, err.message)); }
  }
  const onResize = () => { draw(); clearTimeout(state.timer); state.timer = setTimeout(fetchView, 50); };
  window.addEventListener('resize', onResize);

  const opened = performance.now();
  getJSON(url).then(async (meta) => {
    if (state.stopped) return;
    state.meta = meta;
    state.t1 = meta.duration_ns || 1;
    if (meta.ranks) {
      head.replaceChildren(el('h2', {}, `The job's ranks on one timeline`), el('div', { class: 'muted', id: 'pf-meta' },
        `${meta.ranks.length} rank profiles on rank 0's clock · ${thousands(meta.events)} spans on ${meta.tracks.length} tracks over ${ns(meta.duration_ns)} · ${thousands(meta.collectives)} collectives joined across the ranks (arrows from the first rank to arrive to the last)`),
        ...meta.problems.map((p) => el('div', { class: 'warn' }, p)));
      summary.replaceChildren(...meta.groups.map(groupCard), ranksTable(meta.ranks));
    } else head.replaceChildren(el('h2', {}, name), el('div', { class: 'muted', id: 'pf-meta' },
      `${meta.capture_kind || 'profile'} of ${meta.program ? `${meta.program} ` : ''}pid ${meta.pid}${meta.tag ? ` (${meta.tag})` : ''} on ${meta.instance_type} · ${thousands(meta.events)} spans on ${meta.tracks.length} tracks over ${ns(meta.duration_ns)}`,
      meta.unplaced ? ` · ${thousands(meta.unplaced)} events without a clock sync point left out` : ''),
      ...meta.problems.map((p) => el('div', { class: 'warn' }, p)));
    await fetchView();
    // Opened on the device's work: a profile's (or a job's) start of loading and
    // compiling can take most of its width before the first execution.
    const first = firstDeviceWork(state.data, state.meta);
    const whole = state.t1 - state.t0;
    if (first !== null && first > whole * 0.05) {
      state.t0 = Math.max(0, first - whole * 0.01);
      await fetchView();
    }
    canvas.dataset.firstPaintMs = (performance.now() - opened).toFixed(0);
    // Since the navigation started (performance.now() counts from it).
    canvas.dataset.sinceNavigationMs = performance.now().toFixed(0);
    if (!state.stopped && !meta.ranks) loadSummary();
  }).catch((e) => head.replaceChildren(el('h2', {}, name), el('div', { class: 'error' }, e.message)));

  async function loadSummary() {
    try {
      const body = await getJSON(`${url}/summary`);
      const s = body.summary, x = s.executions, f = s.flops;
      summary.replaceChildren(
        // What failed before the figures.
        ...(s.failures?.said.length ? [el('ul', { class: 'failures', id: 'pf-failures' }, ...s.failures.said.map((l) => el('li', { class: 'bad' }, l)))] : []),
        el('div', { class: 'figures' },
          figure('executions', thousands(x.count)),
          figure('with a device trace', thousands(x.device_traced)),
          figure('latency p50', seconds(x.latency?.p50)),
          figure('latency p99', seconds(x.latency?.p99)),
          figure('on device p50', seconds(x.device_latency?.p50)),
          figure('device time', seconds(s.device_time_s)),
          figure('achieved', f.achieved_per_s == null ? NA : si(f.achieved_per_s, 'FLOP/s')),
          figure('MFU of the defined peak', f.mfu == null ? NA : percent(100 * f.mfu), f.mfu > 1 ? 'warn' : ''),
          figure('defined PE peak', f.peak_per_s == null ? NA : si(f.peak_per_s, 'FLOP/s')),
          figure('backend measured', f.measured_per_s == null ? NA : si(f.measured_per_s, 'FLOP/s')),
          figure('events lost', thousands(s.events.lost_in_rings + s.events.lost_in_file), s.events.lost_in_rings + s.events.lost_in_file ? 'warn' : ''),
        ),
        ...(x.traced.length ? [el('div', { class: 'muted', id: 'pf-traced' },
          `${x.warmup ? `after ${x.warmup} warm-up execution${x.warmup === 1 ? '' : 's'} · ` : s.process.capture_kind === 'capture' ? 'no warm-up · ' : ''}traced: `,
          x.traced.map((t) => `execution ${thousands(t.ordinal)} on nc${t.core}, ${seconds(t.device_s)} on device${t.of_p50 == null ? '' : ` (${t.of_p50.toFixed(2)}× p50)`}`).join('; '))] : []),
        ...(f.peak_basis ? [el('div', { class: 'muted' }, `Defined peak: ${f.peak_basis}. The backend's measured rate is context, not the basis of MFU.`)] : []),
        ...(s.caveats.length ? [el('ul', { class: 'caveats', id: 'pf-caveats' }, ...s.caveats.map((c) => el('li', { class: 'warn' }, c)))] : []),
        ...(s.bounds ? [boundsCard(s.bounds, s.findings)] : []),
        rooflineCard(body.hlo_instructions, f, (hlo) => jumpTo(hlo)),
        el('details', {}, el('summary', {}, 'As neuron-profile view --output-format summary-text prints it'), el('pre', { class: 'summary', id: 'pf-summary-text' }, body.text)),
      );
      tables.replaceChildren(
        el('div', { class: 'card' }, el('h2', {}, 'Engines'), sortableTable([
          { key: 'engine', label: 'engine', text: true }, { key: 'active_s', label: 'active', format: seconds },
          { key: 'percent', label: '% of device time', format: (v) => percent(v) },
          { key: 'instructions', label: 'instructions', format: thousands }, { key: 'flops', label: 'FLOPs', format: (v) => si(v) },
          { key: 'percent_of_peak', label: '% of defined peak', format: (v) => (v == null ? '–' : percent(v)) },
        ], s.engines, { sortKey: 'active_s', id: 'pf-engines' })),
        el('div', { class: 'card' }, el('h2', {}, 'Opcodes'), el('div', { class: 'scroll' }, sortableTable([
          { key: 'engine', label: 'engine', text: true }, { key: 'opcode', label: 'opcode', text: true },
          { key: 'count', label: 'count', format: thousands }, { key: 'time_s', label: 'time', format: seconds },
          { key: 'percent', label: '% of device time', format: (v) => percent(v) },
        ], s.opcodes, { sortKey: 'time_s', id: 'pf-opcodes' }))),
        el('div', { class: 'card' }, el('h2', {}, 'HLO instructions'), el('div', { class: 'scroll' }, sortableTable([
          { key: 'hlo', label: 'HLO instruction', text: true }, { key: 'instructions', label: 'instructions', format: thousands },
          { key: 'time_s', label: 'time', format: seconds }, { key: 'percent', label: '% of device time', format: (v) => percent(v) },
          { key: 'flops', label: 'FLOPs', format: (v) => si(v) }, { key: 'bytes', label: 'bytes', format: bytes },
          { key: 'intensity', label: 'FLOP/byte', format: (v) => (v == null ? '–' : v.toFixed(2)) },
          { key: 'bound', label: 'bound', text: true, format: (v) => v ?? '–' },
          { key: 'roofline_percent', label: '% of roofline', format: (v) => (v == null ? '–' : percent(v)) },
        ], body.hlo_instructions, { sortKey: 'time_s', id: 'pf-hlo' }))),
        el('div', { class: 'card' }, el('h2', {}, 'DMA queues'), sortableTable([
          { key: 'queue', label: 'queue', text: true }, { key: 'transfers', label: 'transfers', format: thousands },
          { key: 'bytes', label: 'bytes', format: bytes }, { key: 'time_s', label: 'time', format: seconds },
          { key: 'bandwidth_bytes_per_s', label: 'bandwidth', format: (v) => (v == null ? 'too short to measure' : si(v, 'B/s')) },
        ], s.dma, { sortKey: 'bytes' })),
        compareWith(name),
      );
    } catch (e) { summary.replaceChildren(el('div', { class: 'error' }, e.message)); }
  }

  // Shows the longest span of an HLO instruction on the timeline, and its details.
  async function jumpTo(hlo) {
    try {
      const at = await getJSON(`${url}/hlo?name=${encodeURIComponent(hlo)}`);
      const margin = Math.max(2000, (at.end_ns - at.start_ns) * 2);
      setRange(Math.max(0, at.start_ns - margin), Math.min(state.meta.duration_ns, at.end_ns + margin));
      showSpan(at.track, at.index);
      canvas.scrollIntoView({ block: 'center' });
    } catch (e) { details.replaceChildren(el('div', { class: 'error' }, e.message)); }
  }

  return {
    stop() {
      state.stopped = true;
      clearTimeout(state.timer);
      window.removeEventListener('resize', onResize);
      window.removeEventListener('mouseup', onMouseUp);
      if (state.controller) state.controller.abort();
    },
  };
}

// The HLO instructions on a roofline (log-log: FLOP per byte against FLOP/s), under
// each engine's defined peak and the memory ceiling; per-engine totals as rings; hover
// for the figures, click to see the instruction on the timeline.
function rooflineCard(hlos, flops, jump) {
  const points = hlos.filter((h) => h.intensity > 0 && h.achieved_flops_per_s > 0);
  const canvas = el('canvas', { id: 'pf-roofline' });
  const info = el('div', { class: 'muted', id: 'pf-roofline-info' }, 'Hover a point for its figures; click it to see the instruction on the timeline.');
  const card = el('div', { class: 'card' }, el('h2', {}, 'Roofline'), canvas, info);
  if (points.length === 0 || !flops.memory_peak_bytes_per_s || !flops.peak_per_s) {
    card.replaceChildren(el('h2', {}, 'Roofline'), el('div', { class: 'muted' }, 'No instruction with FLOPs and bytes, or no peaks in the file: nothing to place on a roofline.'));
    return card;
  }
  const engines = {};
  for (const h of points) {
    const e = (engines[h.engine] ??= { engine: h.engine, flops: 0, bytes: 0, time_s: 0 });
    e.flops += h.flops; e.bytes += h.bytes; e.time_s += h.time_s;
  }
  const totals = Object.values(engines).map((e) => ({ ...e, intensity: e.flops / e.bytes, achieved_flops_per_s: e.flops / e.time_s }));
  const mem = flops.memory_peak_bytes_per_s;
  const ceilings = [['PE', flops.peak_per_s], ['ACT · DVE · POOL', flops.vector_peak_per_s]].filter(([, v]) => v);
  const xs = points.map((p) => p.intensity).concat(ceilings.map(([, v]) => v / mem));
  // A point that reads above its roofline (see "read with care") is drawn on it, where
  // it cannot be, hollow and red; its figure is in its hover text.
  const shown = (h) => (h.roofline_percent > 100 ? (h.achieved_flops_per_s * 100) / h.roofline_percent : h.achieved_flops_per_s);
  const ys = points.map(shown).concat(ceilings.map(([, v]) => v));
  const x0 = 10 ** Math.floor(Math.log10(Math.min(...xs) / 2)), x1 = 10 ** Math.ceil(Math.log10(Math.max(...xs) * 2));
  const y0 = 10 ** Math.floor(Math.log10(Math.min(...ys) / 2)), y1 = 10 ** Math.ceil(Math.log10(Math.max(...ys) * 2));
  let hover = null;
  const draw = () => {
    if (!canvas.isConnected) return;
    const { ctx, width, height } = fitCanvas(canvas, 320);
    const left = 70, bottom = 28, top = 8, right = 10;
    const px = (v) => left + ((Math.log10(v) - Math.log10(x0)) / (Math.log10(x1) - Math.log10(x0))) * (width - left - right);
    const py = (v) => top + (1 - (Math.log10(v) - Math.log10(y0)) / (Math.log10(y1) - Math.log10(y0))) * (height - top - bottom);
    ctx.clearRect(0, 0, width, height);
    ctx.font = '11px system-ui'; ctx.strokeStyle = '#30363d'; ctx.fillStyle = '#8b949e';
    for (let v = x0; v <= x1 * 1.0001; v *= 10) { ctx.beginPath(); ctx.moveTo(px(v), top); ctx.lineTo(px(v), height - bottom); ctx.stroke(); ctx.textAlign = 'center'; ctx.fillText(`${short(v)}`, px(v), height - 10); }
    for (let v = y0; v <= y1 * 1.0001; v *= 10) { ctx.beginPath(); ctx.moveTo(left, py(v)); ctx.lineTo(width - right, py(v)); ctx.stroke(); ctx.textAlign = 'right'; ctx.fillText(short(v, 'FLOP/s'), left - 6, py(v) + 4, left - 8); }
    ctx.textAlign = 'center'; ctx.fillText('FLOP per byte', (left + width) / 2, height - 0);
    // Ceilings: the memory diagonal up to each engine's flat peak.
    for (const [label, peak] of ceilings) {
      const ridge = peak / mem;
      ctx.strokeStyle = '#d29922'; ctx.lineWidth = 1.5; ctx.beginPath();
      ctx.moveTo(px(x0), py(Math.max(y0, x0 * mem))); ctx.lineTo(px(ridge), py(peak)); ctx.lineTo(px(x1), py(peak)); ctx.stroke();
      ctx.fillStyle = '#d29922'; ctx.textAlign = 'right'; ctx.fillText(`${label} peak ${short(peak, 'FLOP/s')}`, width - right - 4, py(peak) - 4);
    }
    ctx.lineWidth = 1;
    // Points above their roofline sit on it, hollow with a red ring; one line says how
    // many (a label each would overlap).
    let above = 0;
    for (const h of points) {
      const x = px(h.intensity), y = py(shown(h)), r = h === hover ? 6 : 4;
      ctx.beginPath(); ctx.arc(x, y, r, 0, 2 * Math.PI);
      if (h.roofline_percent > 100) {
        above++;
        ctx.strokeStyle = '#f85149'; ctx.lineWidth = 2; ctx.stroke();
      } else {
        ctx.fillStyle = colorOf(h.engine); ctx.fill();
      }
    }
    if (above) {
      ctx.fillStyle = '#f85149'; ctx.textAlign = 'left';
      ctx.fillText(`${above} instruction${above === 1 ? ' reads' : 's read'} above the roofline: drawn on it, hollow red; hover for the figure, and see "read with care"`, left + 6, top + 12);
    }
    ctx.lineWidth = 1;
    canvas.dataset.above = above;
    for (const e of totals) {
      ctx.strokeStyle = colorOf(e.engine); ctx.lineWidth = 2; ctx.beginPath(); ctx.arc(px(e.intensity), py(e.achieved_flops_per_s), 9, 0, 2 * Math.PI); ctx.stroke();
      ctx.fillStyle = colorOf(e.engine); ctx.textAlign = 'left'; ctx.fillText(`${e.engine} total`, px(e.intensity) + 12, py(e.achieved_flops_per_s) + 4);
    }
    canvas.dataset.points = points.length;
    return { px, py };
  };
  const nearest = (e) => {
    const scale = draw();
    if (!scale) return null;
    let best = null, bestD = 12 * 12;
    for (const h of points) {
      const d = (scale.px(h.intensity) - e.offsetX) ** 2 + (scale.py(shown(h)) - e.offsetY) ** 2;
      if (d < bestD) { best = h; bestD = d; }
    }
    return best;
  };
  canvas.addEventListener('mousemove', (e) => {
    hover = nearest(e);
    draw();
    if (hover) info.textContent = `${hover.hlo} on ${hover.engine}: ${hover.intensity.toFixed(2)} FLOP/byte, ${si(hover.achieved_flops_per_s, 'FLOP/s')}, ${hover.bound}-bound at ${percent(hover.roofline_percent)} of its roofline${hover.roofline_percent > 100 ? ' (above it: see "read with care")' : ''}, ${seconds(hover.time_s)} (${percent(hover.percent)} of device time). Click to see it on the timeline.`;
  });
  canvas.addEventListener('click', (e) => { const h = nearest(e); if (h) jump(h.hlo); });
  requestAnimationFrame(draw);
  return card;
}

// How fast the traced executions could have been, where the time went, and what to fix.
function boundsCard(b, findings) {
  const per = (v) => (v == null ? NA : seconds(v / Math.max(1, b.executions)));
  const rows = [
    ['host (nrt_execute)', per(b.host_s), 'call to return, measured'],
    ['device (nc_exec_running)', per(b.device_s), 'measured'],
    ['pipeline', per(b.pipeline_s), `the busiest resource: ${b.pipeline_resource}`],
    ['compute', per(b.compute_s), b.compute_engine ? `${b.compute_engine}'s FLOPs at its defined peak` : 'no defined peak in the file'],
    ['memory', per(b.memory_s), b.dma_peak_bytes_per_s ? `the DMA bytes at ${si(b.dma_peak_bytes_per_s, 'B/s')}, the fastest long transfer` : 'no transfer long enough to measure a bandwidth'],
  ];
  return el('div', { class: 'bounds', id: 'pf-bounds' },
    el('h3', {}, `Bounds, per traced execution (${thousands(b.executions)} traced)`),
    el('table', { class: 'fields' }, el('tbody', {}, ...rows.map(([k, v, how]) => el('tr', {}, el('th', {}, k), el('td', {}, v), el('td', { class: 'muted' }, how))))),
    el('div', { class: 'muted' }, `Device idle ${seconds(b.idle_s)} of ${seconds(b.recorded_s)} between the ${thousands(b.recorded_executions)} recorded executions. Where the time goes: ${b.gaps.map((g) => `${g.name} ${seconds(g.seconds)}`).join(' · ')}.`),
    el('h3', {}, 'Findings, by the time they could save'),
    findings.length === 0 ? el('div', { class: 'muted' }, 'Nothing worth fixing: no finding could save 5% of the recorded time.')
      : el('ol', { id: 'pf-findings' }, ...findings.map((f) => el('li', {},
        el('b', {}, `[${f.about}] `), `${f.text}; up to ${seconds(f.saves_s)} (${f.saves_percent.toFixed(0)}% of the recorded time)`,
        el('div', { class: 'muted' }, `evidence: ${f.evidence}`),
        ...(f.suggestion ? [el('div', {}, `try: ${f.suggestion}`)] : [])))));
}

function compareWith(name) {
  const select = el('select', {}, el('option', { value: '' }, 'another profile…'));
  getJSON('/api/profiles').then((list) => list.filter((p) => p.name !== name).forEach((p) => select.append(el('option', { value: p.name }, p.name))));
  select.addEventListener('change', () => { if (select.value) location.hash = `#/compare/${encodeURIComponent(name)}/${encodeURIComponent(select.value)}`; });
  return el('div', { class: 'card' }, el('h2', {}, 'Compare'), el('div', { class: 'toolbar' }, 'Per HLO instruction, this profile against ', select));
}

export function comparePage(main, a, b) {
  const body = el('div', {}, el('div', { class: 'muted' }, 'Comparing…'));
  main.append(el('h2', {}, `${a} → ${b}`), body);
  getJSON(`/api/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`).then((c) => {
    body.replaceChildren(
      el('div', { class: 'figures' },
        figure(`A: ${c.a.name}, device time per execution`, seconds(c.a.device_time_s / Math.max(1, c.a.device_traced))),
        figure(`B: ${c.b.name}, device time per execution`, seconds(c.b.device_time_s / Math.max(1, c.b.device_traced))),
        figure('executions recorded', `${thousands(c.a.executions)} → ${thousands(c.b.executions)}`),
        figure('executions with a device trace', `${thousands(c.a.device_traced)} → ${thousands(c.b.device_traced)}`),
        figure('run-to-run spread (p90 over p50 on device)', `${c.a.spread == null ? NA : percent(100 * c.a.spread)} → ${c.b.spread == null ? NA : percent(100 * c.b.spread)}`)),
      el('div', { class: 'muted', id: 'cmp-noise' }, c.a.spread == null || c.b.spread == null
        ? `Too few executions to tell a change from noise (each side needs ${c.noise_min_traced} with a device trace and 10 recorded): no difference is coloured.`
        : 'Differences within the larger of the two spreads are noise, shown grey; beyond it, red is slower and green faster.'),
      el('div', { class: 'card' }, el('h3', {}, 'Device time per execution, per HLO instruction (B − A; largest change first)'), sortableTable([
        { key: 'hlo', label: 'HLO instruction', text: true },
        { key: 'a_time_s', label: 'A', format: seconds }, { key: 'b_time_s', label: 'B', format: seconds },
        { key: 'difference_s', label: 'B − A', format: (v, r) => el('span', { class: r.within_noise !== false ? 'noise' : v > 0 ? 'bad' : v < 0 ? 'good' : '' }, `${v > 0 ? '+' : ''}${seconds(v)}${r.within_noise === true ? ' (noise)' : ''}`) },
        { key: 'ratio', label: 'B / A', format: (v) => (v == null ? NA : `${v.toFixed(2)}×`) },
        { key: 'a_instructions', label: 'instructions A', format: (v) => (v == null ? NA : Number(v.toFixed(2))) },
        { key: 'b_instructions', label: 'instructions B', format: (v) => (v == null ? NA : Number(v.toFixed(2))) },
      ], c.hlo_instructions.map((r) => ({ ...r, magnitude: Math.abs(r.difference_s) })), { sortKey: 'magnitude', id: 'cmp-table' })),
      el('div', { class: 'card' }, el('h3', {}, 'Bounds per traced execution, and what the difference is made of'),
        el('table', { id: 'cmp-bounds' }, el('thead', {}, el('tr', {}, ['', 'A', 'B', 'B − A'].map((h) => el('th', {}, h)))),
          el('tbody', {}, ...c.analysis.bounds.map((r) => el('tr', {}, el('td', {}, r.name), el('td', {}, seconds(r.a_s)), el('td', {}, seconds(r.b_s)),
            el('td', { class: r.difference_s > 0 ? 'bad' : r.difference_s < 0 ? 'good' : '' }, r.difference_s == null ? NA : `${r.difference_s > 0 ? '+' : ''}${seconds(r.difference_s)}`)))))),
      el('div', { class: 'card' }, el('h3', {}, 'Findings: which went away, which appeared'),
        c.analysis.findings.length === 0 ? el('div', { class: 'muted' }, 'No finding in either profile.')
          : el('ul', { id: 'cmp-findings' }, ...c.analysis.findings.map((f) => {
            const one = f.b || f.a;
            const saves = (x) => (x ? `${seconds(x.saves_s)} (${x.saves_percent.toFixed(0)}%)` : '–');
            return el('li', {}, el('b', { class: f.status === 'went away' ? 'good' : f.status === 'appeared' ? 'bad' : '' }, `${f.status}: `),
              `[${one.about}] ${one.text}`, el('div', { class: 'muted' }, `could save: A ${saves(f.a)} · B ${saves(f.b)}`));
          }))));
  }).catch((e) => body.replaceChildren(el('div', { class: 'error' }, e.message)));
  return {};
}

// The start (ns from the origin) of the first instruction or DMA transfer in `view`, a
// view of the whole profile; `null` when it has none.
function firstDeviceWork(view, meta) {
  if (!view) return null;
  const width = (view.t1 - view.t0) / Math.max(1, view.columns);
  let first = null;
  for (const t of view.tracks) {
    const kind = meta.tracks[t.track]?.kind;
    if (kind !== 'engine' && kind !== 'dma') continue;
    const start = t.mode === 'raw' ? (t.spans.length ? t.spans[0][0] : null)
      : (t.bins.length ? view.t0 + t.bins[0][0] * width : null);
    if (start !== null && (first === null || start < first)) first = start;
  }
  return first;
}

// A communicator of a job's rank profiles: the straggler by the live tools' rule (or that
// nobody is late), and its most skewed collectives.
function groupCard(g) {
  const diagnosis = g.straggler
    ? el('div', { class: 'warn', id: 'pf-straggler', dataset: { rank: g.straggler.rank } }, `Straggler: ${g.straggler.text}`)
    : el('div', { class: 'muted', id: 'pf-straggler' }, `Nobody is late: no rank arrived last in most steps (executions or calls) of the ${thousands(g.complete)} complete collectives.`);
  const shown = g.rows.length < g.collectives ? ` (the ${g.rows.length} most skewed; every one: neuron-profile view -d DIR --output-format summary-text)` : '';
  return el('div', { class: 'group', dataset: { communicator: g.id } },
    el('h3', {}, `Communicator ${g.id}: ${g.ranks} ranks, ${thousands(g.collectives)} collectives; orderings closer than ±${ns(g.uncertainty_ns)} (the clocks' uncertainty) are ties`),
    diagnosis,
    el('div', { class: 'muted' }, `Collectives by arrival skew${shown}:`),
    el('div', { class: 'scroll' }, sortableTable([
      { key: 'sequence', label: 'seq', format: (_, r) => r.position },
      { key: 'operation', label: 'operation', text: true }, { key: 'bytes', label: 'bytes', format: bytes },
      { key: 'algorithm', label: 'algorithm', text: true },
      { key: 'skew_ns', label: 'arrival skew', format: ns },
      { key: 'last', label: 'last in', format: (v, r) => (v == null ? (r.complete ? 'tie' : '?') : `rank ${v}`) },
    ], g.rows, { sortKey: 'skew_ns', id: `pf-collectives-${g.id}` })));
}

// A job's rank profiles: each rank's host, process and clock, and a link to its own
// profile (summary, tables, roofline).
function ranksTable(ranks) {
  const clock = (r) => (r.offset_ns == null ? 'its own (no offset measured: rank 0\'s process, or a job of one)'
    : `moved ${r.offset_ns < 0 ? '−' : '+'}${ns(Math.abs(r.offset_ns))} (± ${ns(r.uncertainty_ns)})`);
  return el('div', {},
    el('h3', {}, 'Ranks'),
    el('table', { id: 'pf-ranks' }, el('tr', {}, ['rank', 'host', 'pid', 'clock onto rank 0\'s', 'spans', 'profile'].map((h) => el('th', {}, h))),
      ...ranks.map((r) => el('tr', { dataset: { rank: r.rank } }, el('td', {}, String(r.rank)), el('td', {}, r.host || '–'), el('td', {}, String(r.pid)),
        el('td', {}, clock(r)), el('td', {}, thousands(r.events)),
        el('td', {}, el('a', { href: `#/profile/${encodeURIComponent(r.name)}` }, r.name))))),
    el('div', { class: 'muted' }, 'Each rank\'s summary, findings and tables are on its own profile\'s page; every collective, and what the straggler was doing before it arrived: neuron-profile view -d DIR --output-format summary-text.'));
}
