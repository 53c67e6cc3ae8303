// The Ranks page: every communicator the host's runtimes take part in, from their flight
// records (the live feed's `ranks`, made by neuron_datastore::ranks, as neuron-top's
// Ranks tab and neuron-monitor's `collectives` group): the diagnosis on top, a heat map
// of ranks × recent collectives coloured by lateness (hover a cell for its figures),
// then every rank's place, state, sequence numbers and what it is doing (from its
// process's datastore on this host, or what its process last said through the root).

import { el, openStream, bytes, ns, NA, quoted } from './common.js';

export function ranksPage(main) {
  const header = el('div', { class: 'toolbar' });
  const empty = el('div', { class: 'empty' }, 'Waiting for the first update…');
  const groups = el('div', { id: 'communicators' });
  const tip = el('div', { class: 'heat-tip', hidden: true });
  main.append(header, empty, groups, tip);
  const status = document.getElementById('status');
  // The figures of the cell under the mouse, kept there as the page is redrawn under it.
  let mouse = null;
  const showTip = () => {
    const under = mouse && document.elementFromPoint(mouse.x, mouse.y);
    const cell = under && under.closest('td.heat');
    tip.hidden = !cell;
    if (!cell) return;
    tip.replaceChildren(...cell.dataset.tip.split('\n').map((line) => el('div', {}, line)));
    tip.style.left = `${mouse.pageX + 12}px`;
    tip.style.top = `${mouse.pageY + 12}px`;
  };
  groups.addEventListener('mousemove', (e) => { mouse = { x: e.clientX, y: e.clientY, pageX: e.pageX, pageY: e.pageY }; showTip(); });
  groups.addEventListener('mouseleave', () => { mouse = null; showTip(); });
  let lastSeq = -1;
  const onUpdate = (message) => {
    const update = JSON.parse(message.data);
    if (update.seq <= lastSeq) return;
    lastSeq = update.seq;
    const ranks = update.ranks || [];
    header.replaceChildren(
      el('span', {}, el('b', {}, `${ranks.length} communicator${ranks.length === 1 ? '' : 's'}`)),
      el('span', { class: 'grow' }),
      el('span', { class: 'muted', id: 'ranks-updates', dataset: { seq: update.seq } }, `update ${update.seq} at ${update.time}`),
    );
    status.textContent = `live · every ${(update.interval_s * 1000).toFixed(0)} ms`;
    empty.textContent = 'No communicator: the runtimes on this host run no collectives (or none yet). A job of ranks (mpirun, torchrun) appears here with every rank.';
    empty.hidden = ranks.length > 0;
    groups.replaceChildren(...ranks.map((g) => communicator(g)));
    showTip();
  };
  const source = openStream('/api/live', { open: () => { lastSeq = -1; }, history: onUpdate, update: onUpdate },
    (text) => { status.textContent = text; });
  return { stop() { source.close(); } };
}

const position = (p) => (p ? (p.index ? `#${p.sequence}.${p.index}` : `#${p.sequence}`) : '–');
const place = (m) => (m.pid ? ` (pid ${m.pid}${m.host ? ` on host ${m.host}` : ''})` : '');
const STATES = { gone: 'gone', waiting: 'waiting', in_collective: 'in collective', running: 'running', idle: 'idle', unknown: 'unknown' };

function communicator(g) {
  const across = g.across ? 'across processes' : 'in one process';
  const clock = g.uncertainty_ns ? ` · clocks within ±${ns(g.uncertainty_ns)}` : '';
  const diagnosis = [];
  if (g.hang) diagnosis.push(el('div', { class: 'diagnosis bad', dataset: { kind: 'hang', class: g.hang.class } }, `${g.hang.class === 'gone' ? 'Rank gone' : 'Hang'}: `, quoted(g.hang.text)));
  if (g.straggler) diagnosis.push(el('div', { class: 'diagnosis warn', dataset: { kind: 'straggler', rank: g.straggler.rank } }, 'Straggler: ', quoted(g.straggler.text)));
  if (!diagnosis.length) {
    const complete = g.collectives.filter((c) => c.complete).length;
    diagnosis.push(el('div', { class: 'diagnosis muted', dataset: { kind: 'none' } }, `No straggler (${complete} complete collectives seen).`));
  }
  return el('div', { class: 'card communicator', dataset: { id: g.id, name: g.name } },
    el('h2', {}, `${g.name}`, el('span', { class: 'muted' }, ` · comm ${g.id} · ${g.ranks} ranks ${across}${clock}`)),
    diagnosis,
    el('h3', {}, 'Lateness by rank and collective'),
    heatMap(g),
    el('h3', {}, 'Ranks'),
    members(g));
}

// Lateness t in [0, 1] as a colour: pale for on time, deep red for the latest.
function shade(t) {
  const light = 92 - 52 * Math.sqrt(Math.max(0, Math.min(1, t)));
  return `hsl(8, 75%, ${light}%)`;
}

// The least lateness the heat map's deepest colour stands for.
const SCALE_FLOOR_NS = 1e6;

function heatMap(g) {
  // The scale ends at the 95th percentile, so that one outlier does not wash the rest
  // out (later cells take the deepest colour), and at 1 ms at least: skews below that
  // are the host's noise, and a balanced job stays pale.
  const all = g.members.flatMap((m) => m.lateness_ns.filter((l) => l !== null)).sort((a, b) => a - b);
  const p95 = all.length ? all[Math.min(all.length - 1, Math.floor(all.length * 0.95))] : 0;
  const max = Math.max(p95, SCALE_FLOOR_NS);
  const columns = g.collectives;
  const head = el('tr', {}, el('th', {}, 'rank'), columns.map((c, i) => el('th', { class: 'heat-col' },
    i % 4 === 0 || i === columns.length - 1 ? position(c.position) : '')));
  const rows = g.members.map((m) => el('tr', { dataset: { rank: m.rank } },
    el('th', {}, `${m.rank}`),
    columns.map((c, i) => {
      const late = m.lateness_ns[i];
      const wait = (c.waits_ns.find((w) => w[0] === m.rank) || [])[1];
      const lines = [
        `rank ${m.rank}${place(m)}`,
        `${c.operation} ${position(c.position)} · ${bytes(c.bytes)} · ${c.algorithm}${c.group ? ` · replica group ${c.group}` : ''}`,
        late !== null ? `arrived ${ns(late)} after the first` : c.complete ? 'arrival not known here' : 'not arrived (yet)',
        wait === undefined ? '' : `waited ${ns(wait)} for the last`,
        c.last === m.rank ? 'arrived last' : '',
        c.last === null && late !== null && late === c.skew_ns ? 'last, but within the clocks\' uncertainty of the next: a tie' : '',
        `skew of the collective ${ns(c.skew_ns)}`,
      ].filter(Boolean);
      const cell = el('td', {
        class: `heat${late === null ? ' unknown' : ''}${c.last === m.rank ? ' last' : ''}`,
        dataset: { seq: c.position.sequence, index: c.position.index, lateness: late ?? '', complete: c.complete, tip: lines.join('\n') },
        'aria-label': lines.join('; '),
      });
      // Through the CSSOM: the page's policy refuses inline style attributes.
      if (late !== null) cell.style.background = shade(max ? late / max : 0);
      return cell;
    })));
  const swatch = (t) => { const s = el('span', { class: 'swatch' }); s.style.background = shade(t); return s; };
  const legend = el('div', { class: 'muted legend' },
    'Colour: lateness (arrival minus the group\'s first), from on time ', swatch(0), ' to ', ns(max), ' and more ', swatch(1),
    '; a framed cell arrived last; grey: not arrived yet, or not known here.');
  return el('div', { class: 'heat-wrap' }, el('table', { class: 'heat-map' }, head, rows), legend);
}

function members(g) {
  const straggler = g.straggler ? g.straggler.rank : null;
  const awaited = g.hang ? g.hang.awaited : [];
  return el('table', { class: 'members' },
    el('tr', {}, ['rank', 'host', 'pid', 'core', 'state', 'given', 'reached', 'done', 'arrived last', 'median late', 'doing'].map((h) => el('th', {}, h))),
    g.members.map((m) => el('tr', {
      class: awaited.includes(m.rank) || m.state === 'gone' ? 'bad' : m.rank === straggler ? 'warn' : '',
      dataset: { rank: m.rank, state: m.state },
    },
    el('td', {}, m.rank), el('td', {}, m.host || '?'), el('td', {}, m.pid || '?'),
    el('td', {}, m.core === null ? '–' : `nc${m.core}`), el('td', {}, STATES[m.state] || m.state),
    el('td', {}, position(m.enqueued)), el('td', {}, position(m.started)), el('td', {}, position(m.completed)),
    el('td', {}, m.arrived_last), el('td', {}, m.median_lateness_ns === null ? NA : ns(m.median_lateness_ns)),
    el('td', { class: 'doing' }, m.doing ? quoted(m.doing) : NA))));
}
