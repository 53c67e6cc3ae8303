// The live timeline: system and device events of every runtime as they happen, a row
// per runtime, core and engine (or DMA queue), scrolling; pause; click for details.

import { el, fitCanvas, colorOf, ns, thousands } from './common.js';

const LABELS = 190; // width of the row labels, px
const ROW = 18;
const MAX_SPANS = 60000;

export function timelinePage(main) {
  let windowSeconds = 10;
  let paused = false, pausedAt = 0;
  let offset = null; // host monotonic ns minus performance.now() ns
  let spans = [];
  let received = 0, thinned = 0, lost = 0, missed = 0;
  let selected = null;
  const rows = new Map(); // key -> {label, index}
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

  const source = new EventSource('/api/events');
  source.addEventListener('batch', (message) => {
    const batch = JSON.parse(message.data);
    const local = performance.now() * 1e6;
    offset = offset === null ? batch.now_ns - local : Math.max(offset, batch.now_ns - local);
    received += batch.spans.length; thinned += batch.thinned; lost += batch.lost;
    for (const s of batch.spans) {
      const key = `${s.pid}/${s.core === null ? 'host' : s.core}/${s.lane}`;
      if (!rows.has(key)) {
        const who = batch.runtimes.find((r) => r.pid === s.pid);
        rows.set(key, { key, label: `${who ? who.tag : s.pid} · ${s.core === null ? 'host' : `nc${s.core}`} · ${s.lane}`, sort: [s.pid, s.core ?? -1, s.kind === 'system' ? '' : s.lane] });
        const ordered = [...rows.values()].sort((a, b) => a.sort[0] - b.sort[0] || a.sort[1] - b.sort[1] || a.sort[2].localeCompare(b.sort[2]));
        ordered.forEach((r, i) => { r.index = i; });
      }
      s.row = rows.get(key);
      spans.push(s);
    }
    if (!paused) {
      const from = hostNow() - 65e9;
      if (spans.length > MAX_SPANS || (spans.length && spans[0].end_ns < from)) {
        spans = spans.filter((s) => s.end_ns >= from).slice(-MAX_SPANS);
      }
    }
    counts.dataset.received = received;
    counts.textContent = `${thousands(received)} events received · ${thousands(thinned)} not sent (stream budget) · ${thousands(lost)} lost in the rings${missed ? ` · ${missed} batches missed` : ''}`;
    status.textContent = `live events · ${batch.runtimes.length} runtime${batch.runtimes.length === 1 ? '' : 's'}`;
  });
  source.addEventListener('lagged', (message) => { missed += JSON.parse(message.data).missed_batches; });
  source.addEventListener('error', () => { status.textContent = 'disconnected: reconnecting…'; });

  const layout = () => {
    const height = Math.max(120, rows.size * ROW + 24);
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
      const y = 20 + r.index * ROW;
      ctx.fillStyle = r.index % 2 ? '#161b22' : '#1b2129';
      ctx.fillRect(0, y, width, ROW);
      ctx.fillStyle = '#8b949e'; ctx.textAlign = 'left';
      ctx.fillText(r.label, 6, y + 13, LABELS - 10);
    }
    for (const s of spans) {
      if (s.end_ns < start || s.start_ns > end) continue;
      const x0 = Math.max(LABELS, x(s.start_ns)), x1 = Math.min(width, x(s.end_ns));
      const y = 20 + s.row.index * ROW + 2;
      ctx.fillStyle = s === selected ? '#ffffff' : colorOf(s.name);
      ctx.fillRect(x0, y, Math.max(1, x1 - x0), ROW - 4);
      if (x1 - x0 > 40) {
        ctx.fillStyle = '#0d1117'; ctx.textAlign = 'left';
        ctx.fillText(s.name, x0 + 3, y + 11, x1 - x0 - 6);
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
    const row = Math.floor((e.offsetY - 20) / ROW);
    const t = start + ((e.offsetX - LABELS) / (width - LABELS)) * (end - start);
    const slack = (3 / (width - LABELS)) * (end - start);
    let best = null;
    for (const s of spans) {
      if (s.row.index !== row || s.start_ns - slack > t || s.end_ns + slack < t) continue;
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
