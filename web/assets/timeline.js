// The live timeline: system and device events of every runtime as they happen, a row
// per runtime, core and engine (or DMA queue), scrolling; pause; click for details.

import { el, openStream, fitCanvas, colorOf, ns, thousands } from './common.js';

const LABELS = 190; // width of the row labels, px
const ROW = 18;
const LEVEL = 12; // height of one nesting level on a runtime row
const LEVELS = 3; // nesting levels drawn (deeper spans share the last)
const MAX_SPANS = 60000;

export function timelinePage(main) {
  let windowSeconds = 10;
  let paused = false, pausedAt = 0;
  let offset = null; // host monotonic ns minus performance.now() ns
  let spans = [];
  let received = 0, thinned = 0, lost = 0, missed = 0, dropped = 0;
  let selected = null;
  let rowsHeight = 20;
  const rows = new Map(); // key -> {label, index, y, height}
  const counts = el('span', { class: 'muted', id: 'tl-counts' });
  const pause = el('button', { id: 'tl-pause', onclick: () => {
    paused = !paused;
    pausedAt = hostNow();
    pause.textContent = paused ? 'Resume' : 'Pause';
    pause.classList.toggle('on', paused);
  } }, 'Pause');
  const span = el('select', { id: 'tl-window', onchange: () => { windowSeconds = Number(span.value); } },
    [2, 5, 10, 30, 60].map((s) => el('option', { value: s, ...(s === 10 ? { selected: '' } : {}) }, `last ${s} s`)));
  const canvas = el('canvas', { id: 'tl-canvas' });
  const details = el('div', { class: 'details', id: 'tl-details' }, el('div', { class: 'muted' }, 'Click an event for its details.'));
  main.append(
    el('div', { class: 'toolbar' }, pause, span, el('span', { class: 'grow' }), counts),
    el('div', { class: 'split' }, el('div', { class: 'timeline' }, canvas), el('div', { class: 'card' }, el('h3', {}, 'Event'), details)),
  );
  const status = document.getElementById('status');

  const hostNow = () => (offset === null ? 0 : performance.now() * 1e6 + offset);
  const viewEnd = () => (paused ? pausedAt : hostNow());

  const onBatch = (message) => {
    const batch = JSON.parse(message.data);
    const local = performance.now() * 1e6;
    offset = offset === null ? batch.now_ns - local : Math.max(offset, batch.now_ns - local);
    received += batch.spans.length; thinned += batch.thinned; lost += batch.lost;
    for (const s of batch.spans) {
      // Paused with a full buffer: newer events are not kept.
      if (paused && spans.length >= MAX_SPANS) { dropped++; continue; }
      const key = `${s.pid}/${s.core === null ? 'host' : s.core}/${s.lane}`;
      if (!rows.has(key)) {
        const who = batch.runtimes.find((r) => r.pid === s.pid);
        const nested = s.kind === 'system';
        rows.set(key, { key, nested, recent: [], height: nested ? LEVELS * LEVEL + 4 : ROW,
          label: `${who && who.tag !== String(s.pid) ? who.tag : `pid ${s.pid}`} · ${s.core === null ? 'host' : `nc${s.core}`} · ${s.lane}`, sort: [s.pid, s.core ?? -1, nested ? '' : s.lane] });
        const ordered = [...rows.values()].sort((a, b) => a.sort[0] - b.sort[0] || a.sort[1] - b.sort[1] || a.sort[2].localeCompare(b.sort[2]));
        let y = 20;
        ordered.forEach((r, i) => { r.index = i; r.y = y; y += r.height; });
        rowsHeight = y;
      }
      s.row = rows.get(key);
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
    }
    if (!paused) {
      const from = hostNow() - 65e9;
      if (spans.length > MAX_SPANS || (spans.length && spans[0].end_ns < from)) {
        spans = spans.filter((s) => s.end_ns >= from).slice(-MAX_SPANS);
      }
    }
    counts.dataset.received = received;
    counts.textContent = `${thousands(received)} events received · ${thousands(thinned)} not sent (stream budget) · ${thousands(lost)} lost in the rings${missed ? ` · ${missed} batches missed` : ''}${dropped ? ` · ${thousands(dropped)} not kept while paused` : ''}`;
    status.textContent = `live events · ${batch.runtimes.length} runtime${batch.runtimes.length === 1 ? '' : 's'}`;
  };
  const source = openStream('/api/events', {
    batch: onBatch,
    lagged: (message) => { missed += JSON.parse(message.data).missed_batches; },
  }, (text) => { status.textContent = text; });

  const layout = () => {
    const height = Math.max(120, rowsHeight + 4);
    return fitCanvas(canvas, height);
  };

  let frame = 0;
  const draw = () => {
    frame = requestAnimationFrame(draw);
    const { ctx, width, height } = layout();
    ctx.clearRect(0, 0, width, height);
    const end = viewEnd(), start = end - windowSeconds * 1e9;
    const w = width - LABELS;
    const x = (t) => LABELS + ((t - start) / (end - start)) * w;
    ctx.font = '11px system-ui';
    for (const r of rows.values()) {
      const y = r.y;
      ctx.fillStyle = r.index % 2 ? '#161b22' : '#1b2129';
      ctx.fillRect(0, y, width, r.height);
      ctx.fillStyle = '#8b949e'; ctx.textAlign = 'left';
      ctx.fillText(r.label, 6, y + 13, LABELS - 10);
    }
    for (const s of spans) {
      if (s.end_ns < start || s.start_ns > end) continue;
      const x0 = Math.max(LABELS, x(s.start_ns)), x1 = Math.min(width, x(s.end_ns));
      const level = Math.min(s.depth, LEVELS - 1);
      const y = s.row.y + 2 + (s.row.nested ? level * LEVEL : 0);
      const h = s.row.nested ? LEVEL - 2 : ROW - 4;
      ctx.fillStyle = s === selected ? '#ffffff' : colorOf(s.name);
      ctx.fillRect(x0, y, Math.max(1, x1 - x0), h);
      if (x1 - x0 > 40) {
        ctx.fillStyle = '#0d1117'; ctx.textAlign = 'left';
        ctx.fillText(s.name, x0 + 3, y + h - 3, x1 - x0 - 6);
      }
    }
    ctx.fillStyle = '#8b949e'; ctx.textAlign = 'center';
    for (let k = 0; k <= 5; k++) {
      const t = start + ((end - start) * k) / 5;
      ctx.fillText(k === 5 ? (paused ? 'paused' : 'now') : `-${((end - t) / 1e9).toFixed(1)}s`, x(t) - (k === 5 ? 24 : 0), 13);
    }
    if (rows.size === 0) {
      ctx.fillStyle = '#8b949e'; ctx.textAlign = 'center';
      ctx.fillText(offset === null ? 'Connecting…' : 'Waiting for events: start a workload (neuron-bench demo) to see its executions here.', width / 2, 60);
    }
  };
  draw();

  canvas.addEventListener('click', (e) => {
    const { width } = layout();
    const end = viewEnd(), start = end - windowSeconds * 1e9;
    const hitRow = [...rows.values()].find((r) => e.offsetY >= r.y && e.offsetY < r.y + r.height);
    if (!hitRow) return;
    const row = hitRow.index;
    const level = hitRow.nested ? Math.min(LEVELS - 1, Math.floor((e.offsetY - hitRow.y - 2) / LEVEL)) : 0;
    const t = start + ((e.offsetX - LABELS) / (width - LABELS)) * (end - start);
    const slack = (3 / (width - LABELS)) * (end - start);
    let best = null;
    for (const s of spans) {
      if (s.row.index !== row || s.start_ns - slack > t || s.end_ns + slack < t) continue;
      if (hitRow.nested && Math.min(s.depth, LEVELS - 1) !== level) continue;
      if (!best || s.end_ns - s.start_ns < best.end_ns - best.start_ns) best = s;
    }
    selected = best;
    if (!best) return;
    details.replaceChildren(
      el('div', {}, el('b', {}, best.name), ` on ${best.row.label}`),
      el('div', { class: 'muted' }, `duration ${ns(best.end_ns - best.start_ns)} · ${((end - best.start_ns) / 1e9).toFixed(3)} s ago`),
      el('pre', {}, JSON.stringify(best.details, null, 2)),
    );
  });

  return { stop() { source.close(); cancelAnimationFrame(frame); } };
}
