// The live page: every runtime on the host, updated over Server-Sent Events.

import { el, openStream, Chart, si, short, bytes, seconds, percent, thousands, PALETTE, NA } from './common.js';

const SPAN = 60; // seconds of history on the charts
const MEMORY = [['tensors', 'tensors'], ['constants', 'constants'], ['model_code', 'model code'],
  ['runtime_memory', 'runtime memory'], ['model_shared_scratchpad', 'model scratchpad']];
const ERROR_CLASSES = ['generic', 'numerical', 'transient', 'model', 'runtime', 'hardware'];
// Warm colours for errors, apart from the executions' green.
const ERROR_COLORS = { generic: '#e15759', numerical: '#f28e2b', transient: '#edc948', model: '#ff6b9d', runtime: '#b07aa1', hardware: '#9c755f' };

export function livePage(main) {
  const header = el('div', { class: 'toolbar' });
  const warnings = el('div');
  const cards = el('div', { id: 'runtimes' });
  const empty = el('div', { class: 'empty' }, 'Waiting for the first update…');
  main.append(header, warnings, empty, cards);
  const status = document.getElementById('status');
  const runtimes = new Map(); // pid -> card state
  let updates = 0;
  const delays = [];
  let lastSeq = -1;
  const onUpdate = (message) => {
    const update = JSON.parse(message.data);
    // The last minute comes first on connecting ('history'), then each new update; an
    // update can come both ways once.
    if (update.seq <= lastSeq) return;
    lastSeq = update.seq;
    updates++;
    if (message.type === 'update') {
      delays.push(Date.now() - update.sent_at_ms);
      if (delays.length > 50) delays.shift();
    }
    // Charts are on the wall clock: the update's own time, and now.
    const at = update.sent_at_ms / 1000, now = Date.now() / 1000;
    const inst = update.instance;
    header.replaceChildren(
      el('span', {}, el('b', {}, inst.instance_type || NA), ` · ${inst.device_count}×${inst.cores_per_device} NeuronCore ${inst.core_version || ''}`),
      el('span', { class: 'muted' }, ` · ${update.runtimes.length} runtime${update.runtimes.length === 1 ? '' : 's'}`),
      el('span', { class: 'muted' }, update.system.vcpu ? ` · host vCPU ${percent(update.system.vcpu.user + update.system.vcpu.system)}` : ''),
      el('span', { class: 'muted' }, update.system.memory_used_bytes != null ? ` · host memory in use ${bytes(update.system.memory_used_bytes)} of ${bytes(update.system.memory_total_bytes)}` : ''),
      el('span', { class: 'grow' }),
      el('span', { class: 'muted', id: 'live-updates', dataset: { count: updates } }, `update ${update.seq} at ${update.time}`),
    );
    status.textContent = `live · every ${(update.interval_s * 1000).toFixed(0)} ms · delay ${Math.max(0, Math.round(median(delays)))} ms`;
    const omitted = update.omitted.models || update.omitted.runtimes
      ? [`Left out to keep the update small: ${update.omitted.runtimes} runtimes, ${update.omitted.models} model rows.`] : [];
    warnings.replaceChildren(...[...update.warnings, ...omitted].map((w) => el('div', { class: 'card warn' }, w)));
    empty.textContent = 'No Neuron runtime is running on this host. Start one (for example `neuron-bench demo`) and it appears here.';
    empty.hidden = update.runtimes.length > 0;
    const seen = new Set();
    for (const r of update.runtimes) {
      seen.add(r.pid);
      let card = runtimes.get(r.pid);
      if (!card) { card = newCard(r); runtimes.set(r.pid, card); cards.append(card.node); }
      updateCard(card, r, update, at, now);
    }
    for (const [pid, card] of runtimes) {
      if (!seen.has(pid)) { card.node.remove(); runtimes.delete(pid); }
    }
  };
  // On each (re)connection the server sends its last minute again: start over from it.
  const onOpen = () => {
    lastSeq = -1;
    for (const card of runtimes.values()) { card.history = []; card.previous = null; }
  };
  const source = openStream('/api/live', { open: onOpen, history: onUpdate, update: onUpdate }, (text) => { status.textContent = text; });
  const onResize = () => { for (const card of runtimes.values()) card.charts.forEach((c) => c.draw()); };
  window.addEventListener('resize', onResize);
  return { stop() { source.close(); window.removeEventListener('resize', onResize); } };
}

function median(values) {
  const s = [...values].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : 0;
}

function newCard(r) {
  const charts = {
    util: new Chart('NeuronCore utilisation', { format: (v) => `${v.toFixed(0)}%`, max: 100, span: SPAN }),
    flops: new Chart('FLOP/s', { unit: 'FLOP/s', axis: (v) => short(v), span: SPAN }),
    latency: new Chart('Latency (p50 and p99, slowest core)', { format: seconds, axis: (v) => short(v, 's'), span: SPAN, log: 'auto' }),
    rate: new Chart('Executions and errors per second', { format: (v) => si(v, '/s'), axis: (v) => short(v), span: SPAN }),
    memory: new Chart('Device memory by category', { format: bytes, axis: (v) => bytes(v).replace('.0 ', ' '), stacked: true, span: SPAN, binary: true }),
  };
  const title = el('h2');
  const summary = el('div', { class: 'muted summary' });
  const cores = el('div');
  const models = el('div');
  const node = el('div', { class: 'card runtime', dataset: { pid: r.pid } }, title, summary,
    el('div', { class: 'row' }, Object.values(charts).map((c) => c.node)),
    el('h3', {}, 'NeuronCores'), cores, el('h3', {}, 'Loaded models'), models);
  return { node, title, summary, cores, models, charts: Object.values(charts), c: charts, history: [], previous: null };
}

function updateCard(card, r, update, at, now) {
  card.node.classList.toggle('exited', r.exited);
  // `stopped` or `stale`: the process is there but its heartbeat is old (Ctrl-Z, a
  // debugger, heavy swap); it keeps its cores and is live again when it resumes.
  const state = r.exited ? ' · exited' : r.state === 'stopped' || r.state === 'stale' ? ` · ${r.state}` : '';
  card.title.textContent = `${r.tag === String(r.pid) ? `pid ${r.pid}` : `${r.tag} (pid ${r.pid})`}${state}`;
  // Errors per second by class, from the counts since the runtime started.
  const errorRates = {};
  if (card.previous) {
    const dt = update.interval_s || 1;
    for (const k of ERROR_CLASSES) errorRates[k] = Math.max(0, (r.errors[k] - card.previous.errors[k]) / dt);
  }
  card.previous = r;
  const execs = r.cores.reduce((a, c) => a + (c.executions_per_second || 0), 0);
  const max = (f) => r.cores.reduce((a, c) => (f(c) == null ? a : Math.max(a ?? 0, f(c))), null);
  const memory = Object.fromEntries(MEMORY.map(([k]) => [k, r.cores.reduce((a, c) => a + c.device_memory[k], 0)]));
  card.history.push({ t: at, cores: r.cores.map((c) => [c.index, c.utilization, c.flops_per_second]), execs, errorRates,
    p50: max((c) => c.latency_p50), p99: max((c) => c.latency_p99), memory });
  while (card.history.length && card.history[0].t < now - SPAN - 2) card.history.shift();
  const coreIds = r.cores.map((c) => c.index);
  const perCore = (k) => coreIds.map((id, i) => ({
    name: `nc${id}`, color: PALETTE[i % PALETTE.length],
    points: card.history.map((h) => [h.t, (h.cores.find((c) => c[0] === id) || [])[k] ?? null]),
  }));
  card.c.util.set(perCore(1), now);
  card.c.flops.set(perCore(2), now);
  card.c.latency.set([
    { name: 'p50', color: '#4e79a7', points: card.history.map((h) => [h.t, h.p50]) },
    { name: 'p99', color: '#e15759', points: card.history.map((h) => [h.t, h.p99]) },
  ], now);
  card.c.rate.set([
    { name: 'executions', color: '#59a14f', points: card.history.map((h) => [h.t, h.execs]) },
    ...ERROR_CLASSES.filter((k) => card.history.some((h) => h.errorRates[k] > 0)).map((k) => ({
      name: `${k} errors`, color: ERROR_COLORS[k], points: card.history.map((h) => [h.t, h.errorRates[k] ?? 0]),
    })),
  ], now);
  card.c.memory.set(MEMORY.map(([k, label], i) => ({
    name: label, color: PALETTE[i], points: card.history.map((h) => [h.t, h.memory[k]]),
  })), now);
  const vcpu = r.vcpu ? percent(r.vcpu.user + r.vcpu.system) : NA;
  const errorsTotal = ERROR_CLASSES.reduce((a, k) => a + r.errors[k], 0);
  card.summary.replaceChildren(
    `vCPU ${vcpu} · resident memory ${r.resident_bytes == null ? NA : bytes(r.resident_bytes)} · runtime host allocations ${bytes(r.host_memory.application_memory + r.host_memory.constants + r.host_memory.dma_buffers + r.host_memory.tensors)}`,
    ` · ${si(execs, 'exec/s')} · errors since start: `,
    el('span', { class: errorsTotal ? 'bad' : '' }, errorsTotal ? ERROR_CLASSES.filter((k) => r.errors[k]).map((k) => `${k} ${thousands(r.errors[k])}`).join(', ') : 'none'),
    ` · trace ${r.trace_events_per_second == null ? NA : si(r.trace_events_per_second, 'events/s')}, `,
    el('span', { class: r.trace_events_dropped ? 'warn' : '', id: `dropped-${r.pid}` }, `${thousands(r.trace_events_dropped)} dropped`),
  );
  card.cores.replaceChildren(el('table', { class: 'cores' },
    el('tr', {}, ['core', 'utilisation', 'FLOP/s', 'exec/s', 'p50', 'p99', 'device memory'].map((h) => el('th', {}, h))),
    r.cores.map((c) => el('tr', { dataset: { core: c.index } },
      el('td', {}, `nc${c.index}`),
      el('td', { class: 'util' }, c.utilization == null ? NA : percent(c.utilization)),
      el('td', { class: 'flops' }, si(c.flops_per_second, 'FLOP/s')),
      el('td', { class: 'execs' }, c.executions_per_second == null ? NA : c.executions_per_second.toFixed(1)),
      el('td', {}, seconds(c.latency_p50)),
      el('td', {}, seconds(c.latency_p99)),
      el('td', {}, bytes(MEMORY.reduce((a, [k]) => a + c.device_memory[k], 0))),
    ))));
  card.models.replaceChildren(r.models.length === 0 ? el('div', { class: 'muted' }, 'none') : el('table', {},
    el('tr', {}, ['model', 'id', 'core', 'executions', 'exec/s', 'p50', 'p99', 'device memory', 'runtime host allocations'].map((h) => el('th', {}, h))),
    r.models.map((m) => el('tr', { class: 'model', dataset: { model: m.name } }, el('td', {}, m.name), el('td', {}, m.model_id), el('td', {}, `nc${m.core}`),
      el('td', {}, thousands(m.executions)), el('td', { class: 'execs' }, m.executions_per_second == null ? NA : m.executions_per_second.toFixed(1)),
      el('td', { class: 'p50' }, seconds(m.latency_p50)), el('td', { class: 'p99' }, seconds(m.latency_p99)),
      el('td', {}, bytes(MEMORY.reduce((a, [k]) => a + m.device_memory[k], 0))), el('td', {}, bytes(m.host_memory))))));
}
