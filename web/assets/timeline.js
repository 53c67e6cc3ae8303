// The live timeline: system and device events of every runtime as they happen, a row
// per runtime and core (its API calls and executions), then one per engine and DMA
// queue of that core; scrolling; pause, zoom and pan; search; click for details.
//
// When the feed cannot send every device event it sends whole executions, spread over
// time and cores, and each core's busy fraction from the counters: the core's row
// shows that as a band behind its spans, so a busy core never looks idle.

import { el, openStream, fitCanvas, colorOf, ns, si, bytes, thousands } from './common.js';

const LABELS = 210; // width of the row labels, px
const ROW = 18;
const LEVEL = 12; // height of one nesting level on a runtime row
const LEVELS = 3; // nesting levels drawn (deeper spans share the last)
const MAX_SPANS = 80000;
const WINDOWS = [0.5, 1, 2, 5, 10, 30, 60];
// Engines first, then DMA queues, in the profile viewer's order.
const LANE_ORDER = ['runtime', 'PE', 'ACT', 'DVE', 'POOL', 'SP'];

// The tick step (1, 2 or 5 times a power of ten) that puts about `count` ticks in `span`.
export function tickStep(span, count = 6) {
  const raw = span / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || 10 * power;
}

// "2 s", "500 ms": a round tick's distance from now.
function tickLabel(s) {
  return s >= 1 ? `${Number(s.toFixed(3))} s` : `${Number((s * 1e3).toFixed(3))} ms`;
}

// `focus`: an execution to find in the rings and pause on, `ID` or `PID:ID` (of process
// PID only) (#/execution/PID:ID, where a
// Grafana exemplar links), or null.
export function timelinePage(main, focus = null) {
  let windowSeconds = 10;
  let paused = false, pausedAt = 0;
  let offset = null; // host monotonic ns minus performance.now() ns
  let spans = [];
  let lastSeq = 0, feedId = null;
  let received = 0, thinned = 0, thinnedExecutions = 0, lost = 0, missed = 0, dropped = 0;
  let selected = null;
  let query = '';
  let rowsHeight = 20;
  let runtimes = [];
  const rows = new Map(); // key -> {label, index, y, height, nested, recent, busy: [{start_ns, end_ns, fraction}]}
  const counts = el('span', { class: 'muted', id: 'tl-counts' });
  const togglePause = () => {
    paused = !paused;
    pausedAt = hostNow();
    pause.textContent = paused ? 'Resume' : 'Pause';
    pause.classList.toggle('on', paused);
  };
  const pause = el('button', { id: 'tl-pause', onclick: togglePause, title: 'Space' }, 'Pause');
  const windowSelect = el('select', { id: 'tl-window', onchange: () => { windowSeconds = Number(windowSelect.value); } },
    WINDOWS.map((s) => el('option', { value: s, ...(s === 10 ? { selected: '' } : {}) }, `last ${s} s`)));
  const search = el('input', { id: 'tl-search', type: 'search', placeholder: 'search: name, HLO, model', oninput: () => { query = search.value.trim().toLowerCase(); } });
  const canvas = el('canvas', { id: 'tl-canvas' });
  const details = el('div', { class: 'details', id: 'tl-details' }, el('div', { class: 'muted' }, 'Click an event for its details.'));
  main.append(
    el('div', { class: 'toolbar' }, pause, windowSelect, search, el('span', { class: 'grow' }), counts),
    el('div', { class: 'muted keys' }, 'Keys: Space pause · + / − zoom · ← / → pan (pauses) · / search · Esc clear. Bands behind a core\'s row are its busy time from the counters; the spans on it are the executions the stream could send whole.'),
    el('div', { class: 'split' }, el('div', { class: 'timeline' }, canvas), el('div', { class: 'card' }, el('h3', {}, 'Event'), details)),
  );
  const status = document.getElementById('status');

  const hostNow = () => (offset === null ? 0 : performance.now() * 1e6 + offset);
  const viewEnd = () => (paused ? pausedAt : hostNow());
  const who = (pid) => runtimes.find((r) => r.pid === pid);

  const rowFor = (pid, core, lane) => {
    const key = `${pid}/${core === null ? 'host' : core}/${lane}`;
    if (!rows.has(key)) {
      const nested = lane === 'runtime';
      const r = who(pid);
      const name = r ? r.tag : `pid ${pid}`;
      const laneRank = LANE_ORDER.includes(lane) ? LANE_ORDER.indexOf(lane) : LANE_ORDER.length;
      rows.set(key, { key, pid, core, lane, nested, recent: [], busy: [], spans: 0, height: nested ? LEVELS * LEVEL + 4 : ROW,
        label: nested ? `${name} · ${core === null ? 'host' : `nc${core}`}` : `    ${lane}`,
        sort: [pid, core ?? -1, laneRank, lane] });
      const ordered = [...rows.values()].sort((a, b) => a.sort[0] - b.sort[0] || a.sort[1] - b.sort[1] || a.sort[2] - b.sort[2] || a.sort[3].localeCompare(b.sort[3]));
      let y = 20;
      ordered.forEach((row, i) => { row.index = i; row.y = y; y += row.height; });
      rowsHeight = y;
    }
    return rows.get(key);
  };

  const place = (s) => {
    s.row = rowFor(s.pid, s.core, s.lane);
    s.text = `${s.name} ${s.hlo || ''} ${s.model || ''}`.toLowerCase();
    // System spans nest (nrt_execute around its phases): a span's level is how many
    // recent spans of its row contain it.
    s.depth = 0;
    if (s.row.nested) {
      // Of two spans with the same times, the one that arrived first is the outer one.
      for (const o of s.row.recent) if (o.start_ns <= s.start_ns && o.end_ns >= s.end_ns) s.depth++;
      for (const o of s.row.recent) if (s.start_ns <= o.start_ns && s.end_ns >= o.end_ns && !(s.start_ns === o.start_ns && s.end_ns === o.end_ns)) o.depth++;
      s.row.recent.push(s);
      if (s.row.recent.length > 64) s.row.recent.shift();
    }
    spans.push(s);
  };

  const onBatch = (message) => {
    const batch = JSON.parse(message.data);
    // A restarted dashboard counts from 1 again.
    if (batch.feed !== feedId) { feedId = batch.feed; lastSeq = 0; }
    // The kept batches and the live ones may overlap when the page opens.
    if (batch.seq <= lastSeq) return;
    lastSeq = batch.seq;
    runtimes = batch.runtimes;
    const local = performance.now() * 1e6;
    offset = offset === null ? batch.now_ns - local : Math.max(offset, batch.now_ns - local);
    received += batch.spans.length; thinned += batch.thinned; thinnedExecutions += batch.thinned_executions || 0; lost += batch.lost;
    for (const b of batch.busy || []) {
      // A core that did nothing yet has no row: busy time gives it one.
      if (b.fraction <= 0 && !rows.has(`${b.pid}/${b.core}/runtime`)) continue;
      const row = rowFor(b.pid, b.core, 'runtime');
      row.busy.push(b);
      if (row.busy.length > 1200) row.busy.shift();
    }
    for (const s of batch.spans) {
      // Paused with a full buffer: newer events are not kept.
      if (paused && spans.length >= MAX_SPANS) { dropped++; continue; }
      place(s);
    }
    if (!paused) {
      const from = hostNow() - 65e9;
      if (spans.length > MAX_SPANS || (spans.length && spans[0].end_ns < from)) {
        spans = spans.filter((s) => s.end_ns >= from).slice(-MAX_SPANS);
      }
    }
    counts.dataset.received = received;
    counts.dataset.thinnedExecutions = thinnedExecutions;
    counts.textContent = `${thousands(received)} events received · ${thousands(thinnedExecutions)} executions (${thousands(thinned)} events) not sent, shown as busy bands · ${thousands(lost)} lost in the rings${missed ? ` · ${missed} batches missed` : ''}${dropped ? ` · ${thousands(dropped)} not kept while paused` : ''}`;
    status.textContent = `live events · ${batch.runtimes.length} runtime${batch.runtimes.length === 1 ? '' : 's'}`;
  };
  const source = openStream('/api/events', {
    batch: onBatch,
    lagged: (message) => { missed += JSON.parse(message.data).missed_batches; },
  }, (text) => { status.textContent = text; });

  const layout = () => fitCanvas(canvas, Math.max(120, rowsHeight + 4));

  let frame = 0, frames = 0;
  const draw = () => {
    frame = requestAnimationFrame(draw);
    const { ctx, width, height } = layout();
    ctx.clearRect(0, 0, width, height);
    const end = viewEnd(), start = end - windowSeconds * 1e9;
    const w = width - LABELS;
    const x = (t) => LABELS + ((t - start) / (end - start)) * w;
    ctx.font = '11px system-ui';
    const stats = new Map();
    for (const r of rows.values()) {
      const y = r.y;
      ctx.fillStyle = r.index % 2 ? '#161b22' : '#1b2129';
      ctx.fillRect(0, y, width, r.height);
      // Busy time from the counters: an area as high as the core was busy.
      let busyShown = 0, covered = 0, latest = null;
      for (const b of r.busy) {
        if (b.end_ns < start || b.start_ns > end) continue;
        const x0 = Math.max(LABELS, x(b.start_ns)), x1 = Math.min(width, x(b.end_ns));
        const h = (r.height - 2) * b.fraction;
        ctx.fillStyle = 'rgba(88, 166, 255, 0.28)';
        ctx.fillRect(x0, y + r.height - 1 - h, Math.max(1, x1 - x0), h);
        busyShown += b.fraction * (b.end_ns - b.start_ns);
        covered += b.end_ns - b.start_ns;
        latest = b;
      }
      ctx.fillStyle = '#8b949e'; ctx.textAlign = 'left';
      // Busy over the window shown, from the counters.
      const busyText = covered ? ` · ${Math.round((100 * busyShown) / covered)}% busy` : '';
      ctx.fillText(r.label + busyText, 6, y + 13, LABELS - 10);
      stats.set(r.key, { label: r.label.trim(), lane: r.lane, core: r.core, spans: 0, busy_ns: busyShown, fraction: latest ? latest.fraction : null });
    }
    let matches = 0;
    for (const s of spans) {
      if (s.end_ns < start || s.start_ns > end) continue;
      stats.get(s.row.key).spans++;
      const x0 = Math.max(LABELS, x(s.start_ns)), x1 = Math.min(width, x(s.end_ns));
      const level = Math.min(s.depth, LEVELS - 1);
      const y = s.row.y + 2 + (s.row.nested ? level * LEVEL : 0);
      const h = s.row.nested ? LEVEL - 2 : ROW - 4;
      const hit = !query || s.text.includes(query);
      if (query && hit) matches++;
      ctx.globalAlpha = hit ? 1 : 0.15;
      ctx.fillStyle = s === selected ? '#ffffff' : colorOf(s.name);
      ctx.fillRect(x0, y, Math.max(1, x1 - x0), h);
      if (x1 - x0 > 40) {
        ctx.fillStyle = '#0d1117'; ctx.textAlign = 'left';
        ctx.fillText(s.name, x0 + 3, y + h - 3, x1 - x0 - 6);
      }
      ctx.globalAlpha = 1;
    }
    // Round ticks: seconds before now, in 1, 2 or 5 steps; "now" drawn inside the edge.
    ctx.fillStyle = '#8b949e';
    const step = tickStep(windowSeconds) * 1e9;
    const ticks = [];
    for (let t = end - step; t > start; t -= step) ticks.push(t);
    ctx.textAlign = 'center';
    for (const t of ticks) {
      const label = `−${tickLabel((end - t) / 1e9)}`;
      if (x(t) > LABELS + 20 && x(t) < width - 60) ctx.fillText(label, x(t), 13);
      ctx.fillRect(x(t), 16, 1, 4);
    }
    ctx.textAlign = 'right';
    ctx.fillText(paused ? 'paused' : 'now', width - 4, 13);
    if (rows.size === 0) {
      ctx.fillStyle = '#8b949e'; ctx.textAlign = 'center';
      ctx.fillText(offset === null ? 'Connecting…' : 'Waiting for events: start a workload (neuron-bench demo) to see its executions here.', width / 2, 60);
    }
    // What the page shows, for tests and for people reading the DOM.
    if (++frames % 15 === 0) {
      canvas.dataset.rows = JSON.stringify([...stats.values()]);
      canvas.dataset.ticks = JSON.stringify(ticks.map((t) => (end - t) / 1e9));
      canvas.dataset.matches = matches;
    }
  };
  draw();

  const onKey = (e) => {
    if (e.target === search) {
      if (e.key === 'Escape') { search.value = ''; query = ''; search.blur(); }
      return;
    }
    const i = WINDOWS.indexOf(windowSeconds);
    if (e.key === ' ') togglePause();
    else if (e.key === '+' || e.key === '=') windowSeconds = WINDOWS[Math.max(0, i - 1)];
    else if (e.key === '-' || e.key === '_') windowSeconds = WINDOWS[Math.min(WINDOWS.length - 1, i + 1)];
    else if (e.key === 'ArrowLeft' || e.key === 'ArrowRight') {
      if (!paused) togglePause();
      pausedAt = Math.min(hostNow(), pausedAt + (e.key === 'ArrowLeft' ? -1 : 1) * windowSeconds * 1e9 * 0.2);
    } else if (e.key === '/') { search.focus(); } else if (e.key === 'Escape') { selected = null; } else return;
    windowSelect.value = String(windowSeconds);
    e.preventDefault();
  };
  document.addEventListener('keydown', onKey);

  const select = (s) => {
    selected = s;
    if (!s) return;
    details.replaceChildren(...describe(s));
  };

  // The details pane: a table of the span's fields with names and human times, and
  // links to the spans it belongs with.
  const describe = (s) => {
    const execution = s.exec == null ? null : spans.find((o) => o.pid === s.pid && o.core === s.core && o.exec === s.exec && o.name === 'nc_exec_running');
    const r = who(s.pid);
    const rowsOut = [
      ['event', s.name],
      ['where', `${r ? r.tag : `pid ${s.pid}`} (pid ${s.pid}) · ${s.core === null ? 'host' : `nc${s.core}`} · ${s.lane}`],
      ['duration', ns(s.end_ns - s.start_ns)],
      ['started', execution && execution !== s && s.start_ns >= execution.start_ns ? `${ns(s.start_ns - execution.start_ns)} into execution ${s.exec}` : `${((hostNow() - s.start_ns) / 1e9).toFixed(3)} s ago`],
    ];
    if (s.model) rowsOut.push(['model', s.model]);
    if (s.exec != null) rowsOut.push(['execution', String(s.exec)]);
    if (s.hlo) rowsOut.push(['HLO instruction', s.hlo]);
    if (s.flops) rowsOut.push(['FLOPs', `${si(s.flops)} (${si(s.flops / Math.max(1e-9, (s.end_ns - s.start_ns) / 1e9), 'FLOP/s')})`]);
    if (s.bytes) rowsOut.push(['bytes', bytes(s.bytes)]);
    const d = s.details || {};
    for (const [k, v] of Object.entries(d.data || {})) if (!['exec_id', 'model_id'].includes(k)) rowsOut.push([k.replaceAll('_', ' '), typeof v === 'object' ? JSON.stringify(v) : String(v)]);
    if (d.tracking_id !== undefined) rowsOut.push(['tracking id', String(d.tracking_id)]);
    if (d.thread_id !== undefined) rowsOut.push(['thread', String(d.thread_id)]);
    if (d.nrta_seq_id !== undefined && d.nrta_seq_id !== null) rowsOut.push(['nrta seq id', String(d.nrta_seq_id)]);
    const links = [];
    if (execution && execution !== s) links.push(el('a', { href: '#', onclick: (e) => { e.preventDefault(); select(execution); } }, `its execution (${ns(execution.end_ns - execution.start_ns)})`));
    if (s.hlo) links.push(el('a', { href: '#', onclick: (e) => { e.preventDefault(); search.value = s.hlo; query = s.hlo.toLowerCase(); } }, `every span of ${s.hlo}`));
    return [
      el('table', { class: 'fields' }, el('tbody', {}, ...rowsOut.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, v))))),
      ...(links.length ? [el('div', { class: 'links' }, 'Show: ', ...links.flatMap((a, i) => (i ? [' · ', a] : [a])))] : []),
    ];
  };

  canvas.addEventListener('click', (e) => {
    const { width } = layout();
    const end = viewEnd(), start = end - windowSeconds * 1e9;
    const hitRow = [...rows.values()].find((r) => e.offsetY >= r.y && e.offsetY < r.y + r.height);
    if (!hitRow) return;
    const level = hitRow.nested ? Math.min(LEVELS - 1, Math.floor((e.offsetY - hitRow.y - 2) / LEVEL)) : 0;
    const t = start + ((e.offsetX - LABELS) / (width - LABELS)) * (end - start);
    const slack = (3 / (width - LABELS)) * (end - start);
    let best = null;
    for (const s of spans) {
      if (s.row !== hitRow || s.start_ns - slack > t || s.end_ns + slack < t) continue;
      if (hitRow.nested && Math.min(s.depth, LEVELS - 1) !== level) continue;
      if (!best || s.end_ns - s.start_ns < best.end_ns - best.start_ns) best = s;
    }
    select(best);
  });

  // An execution to show: found in the rings and paused on, or said plainly gone.
  let ticking = 0;
  if (focus !== null) {
    const [pid, id] = focus.includes(':') ? focus.split(':', 2) : [null, focus];
    focus = id;
    const looking = `Looking for execution ${id}${pid ? ` of pid ${pid}` : ''} in the rings of this host's runtimes`;
    const banner = el('div', { class: 'card', id: 'tl-focus' }, `${looking}…`);
    main.insertBefore(banner, main.children[1] || null);
    // Reading every event of every ring takes a while on a busy host: say how long so far.
    const asked = performance.now();
    ticking = setInterval(() => {
      banner.textContent = `${looking}: ${((performance.now() - asked) / 1000).toFixed(0)} s so far (every event of each ring is read; a busy host's rings hold millions)…`;
    }, 1000);
    fetch(`/api/execution/${encodeURIComponent(id)}${pid ? `?pid=${encodeURIComponent(pid)}` : ''}`)
      .then((r) => (r.ok ? r.json() : r.text().then((t) => Promise.reject(new Error(t || r.statusText)))))
      .then((answer) => {
        clearInterval(ticking);
        const [first, ...others] = answer.found;
        if (!first) {
          const held = answer.runtimes.map((r) => (r.oldest_ns == null
            ? `${r.tag} (pid ${r.pid}) holds no events`
            : `${r.tag} (pid ${r.pid}) holds events from ${((answer.now_ns - r.oldest_ns) / 1e9).toFixed(1)} s ago on`));
          banner.dataset.state = 'gone';
          banner.textContent = answer.runtimes.length
            ? `Execution ${focus} is no longer in the rings: ${held.join('; ')}. The always-on rings keep the last events only (about a second of a busy core); to keep executions for later, capture a profile (neuron-profile capture, or neuron-profile inspect on a running process).`
            : `Execution ${focus} is not in any ring: ${pid ? `no runtime of pid ${pid}` : 'no runtime'} is running on this host now.`;
          return;
        }
        const key = (o) => `${o.pid}/${o.core}/${o.lane}/${o.name}/${o.start_ns}`;
        const have = new Set(spans.filter((o) => o.exec === answer.exec_id).map(key));
        for (const s of first.spans) if (!have.has(key(s))) place(s);
        const duration = Math.max(1, first.end_ns - first.start_ns);
        windowSeconds = WINDOWS.find((w) => w * 1e9 >= 2 * duration) || WINDOWS[WINDOWS.length - 1];
        windowSelect.value = String(windowSeconds);
        paused = true;
        pause.textContent = 'Resume';
        pause.classList.add('on');
        pausedAt = first.end_ns + (windowSeconds * 1e9 - duration) / 2;
        const mine = spans.filter((o) => o.pid === first.pid && o.exec === answer.exec_id);
        const outer = mine.find((o) => o.name === 'nrt_execute') || mine.find((o) => o.name === 'nc_exec_running') || mine[0];
        if (outer) select(outer);
        const model = outer && outer.model ? `${outer.model} ` : '';
        const also = others.length ? ` Also in ${others.map((o) => `pid ${o.pid}`).join(', ')}: an execution id counts per process.` : '';
        banner.dataset.state = 'found';
        banner.textContent = `Execution ${focus}: ${model}on ${first.tag} (pid ${first.pid}) nc${first.core}, ${ns(duration)}, ended ${((answer.now_ns - first.end_ns) / 1e9).toFixed(1)} s ago. Paused on it: Space resumes the live view.${also}`;
      })
      .catch((e) => { clearInterval(ticking); banner.dataset.state = 'error'; banner.textContent = `Cannot look for execution ${focus}: ${e.message}`; });
  }

  return { stop() { source.close(); cancelAnimationFrame(frame); clearInterval(ticking); document.removeEventListener('keydown', onKey); } };
}
