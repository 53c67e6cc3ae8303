// Helpers shared by the pages: elements, number formats, colours, line charts on a
// canvas, sortable tables.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === 'class') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// The tools' texts quote names in backticks (`train_step`, comm `grads`): as nodes,
// each quoted name in a <code> element, the backticks gone.
export function quoted(text) {
  return String(text).split('`').map((part, i) => (i % 2 ? el('code', {}, part) : part));
}

// An event stream that comes back: EventSource retries a dropped connection by itself,
// but gives up on a refusal (503 when the dashboard serves its most pages, 401); this
// tries again later, waiting longer each time. `handlers` maps event names to functions.
export function openStream(url, handlers, onStatus) {
  let source = null, timer = 0, wait = 2, closed = false;
  const connect = () => {
    source = new EventSource(url);
    for (const [name, handler] of Object.entries(handlers)) {
      source.addEventListener(name, (message) => { wait = 2; handler(message); });
    }
    source.addEventListener('error', () => {
      if (source.readyState === EventSource.CLOSED && !closed) {
        onStatus(`refused by the dashboard (busy, or a token is needed): trying again in ${wait} s`);
        timer = setTimeout(connect, wait * 1000);
        wait = Math.min(30, wait * 2);
      } else {
        onStatus('disconnected: reconnecting…');
      }
    });
  };
  connect();
  return { close() { closed = true; clearTimeout(timer); source.close(); } };
}

export async function getJSON(url, options = {}) {
  const response = await fetch(url, options);
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response.json();
}

export const NA = 'N/A';

export function si(value, unit = '') {
  if (value === null || value === undefined || !Number.isFinite(value)) return NA;
  const prefixes = [[1e15, 'P'], [1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
  for (const [scale, prefix] of prefixes) {
    if (Math.abs(value) >= scale) return `${(value / scale).toFixed(2)} ${prefix}${unit}`;
  }
  return `${value.toFixed(value >= 100 || value === 0 ? 0 : 1)} ${unit}`.trim();
}

export function bytes(value) {
  if (value === null || value === undefined) return NA;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = value, k = 0;
  while (v >= 1024 && k < units.length - 1) { v /= 1024; k++; }
  return `${v.toFixed(k === 0 ? 0 : 1)} ${units[k]}`;
}

// Three significant digits and an SI prefix, for chart axes: `4.35 G`.
export function short(value, unit = '') {
  if (!Number.isFinite(value)) return NA;
  const prefixes = [[1e15, 'P'], [1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k'], [1, ''], [1e-3, 'm'], [1e-6, 'µ'], [1e-9, 'n']];
  if (value === 0) return `0${unit ? ` ${unit}` : ''}`;
  for (const [scale, prefix] of prefixes) {
    if (Math.abs(value) >= scale) return `${Number((value / scale).toPrecision(3))} ${prefix}${unit}`.trim();
  }
  return value.toPrecision(3);
}

export function seconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return NA;
  const a = Math.abs(s);
  if (a >= 1) return `${s.toFixed(3)} s`;
  if (a >= 1e-3) return `${(s * 1e3).toFixed(3)} ms`;
  if (a >= 1e-6) return `${(s * 1e6).toFixed(1)} µs`;
  return `${(s * 1e9).toFixed(0)} ns`;
}

export function ns(value) { return seconds(value / 1e9); }

export function percent(v, digits = 1) {
  return v === null || v === undefined ? NA : `${v.toFixed(digits)}%`;
}

export function thousands(n) { return n === null || n === undefined ? NA : Math.round(n).toLocaleString('en-US'); }

export const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7',
  '#9c755f', '#bab0ac', '#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b'];

export function colorOf(name) {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) { h ^= name.charCodeAt(i); h = Math.imul(h, 16777619); }
  return PALETTE[(h >>> 0) % PALETTE.length];
}

// A canvas sized to its box in device pixels; returns the 2D context scaled to CSS pixels.
export function fitCanvas(canvas, height) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.parentElement.clientWidth || 300;
  if (height) canvas.style.height = `${height}px`;
  const h = height || canvas.clientHeight || 150;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(h * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(h * ratio);
  }
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return { ctx, width, height: h };
}

// A tick step of 1, 2 or 5 times a power of ten (or a power of two, `binary`) that puts
// about `count` ticks in `span`.
export function niceStep(span, count = 4, binary = false) {
  const raw = span / count;
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  if (binary) return 2 ** Math.ceil(Math.log2(raw));
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((c) => c >= raw * (1 - 1e-12)) || 10 * power;
}

// A chart of series over time: [{name, color, points: [[t, v], ...]}]. Stacked series
// are drawn as areas on top of each other. The value axis has round ticks; with
// `log: 'auto'` it turns logarithmic when the values span more than a decade (a
// button on the title switches). Hovering shows the time and every series' value; the
// legend shows each series' latest value, so a category too small to see is still read.
export class Chart {
  constructor(title, { unit = '', format = (v) => si(v, unit), axis = null, stacked = false, max = null, span = 60, log = false, binary = false } = {}) {
    this.canvas = el('canvas');
    this.legend = el('div', { class: 'legend' });
    this.scaleButton = log ? el('button', { class: 'scale', onclick: () => { this.logChoice = !this.isLog(); this.draw(); } }, 'log') : null;
    this.node = el('div', { class: 'chart' }, el('div', { class: 'title' }, title, ...(this.scaleButton ? [' ', this.scaleButton] : [])), this.canvas, this.legend);
    Object.assign(this, { format, axis: axis || format, stacked, max, span, log, binary, logChoice: null });
    this.series = [];
    this.canvas.addEventListener('mousemove', (e) => { this.hover = e.offsetX; this.draw(); });
    this.canvas.addEventListener('mouseleave', () => { this.hover = null; this.draw(); });
  }

  set(series, now) { this.series = series; this.now = now; this.draw(); }

  // Logarithmic: as chosen, else (with `log: 'auto'`) when the values span a decade.
  isLog() {
    if (!this.log || this.stacked) return false;
    if (this.logChoice !== null) return this.logChoice;
    const values = this.series.flatMap((s) => s.points.map(([, v]) => v)).filter((v) => v > 0);
    return values.length > 1 && Math.max(...values) / Math.min(...values) > 10;
  }

  draw() {
    if (!this.node.isConnected) return;
    const { ctx, width, height } = fitCanvas(this.canvas);
    const left = 70, right = 8, top = 6, bottom = 18;
    const w = width - left - right, h = height - top - bottom;
    ctx.clearRect(0, 0, width, height);
    const now = this.now ?? 0, from = now - this.span;
    const sums = new Map();
    let max = 0, min = Infinity;
    const shapes = this.series.map((s) => {
      const pts = s.points.filter(([t]) => t >= from - 1).map(([t, v]) => {
        let base = 0;
        if (this.stacked) { base = sums.get(t) || 0; sums.set(t, base + (v || 0)); }
        const top = base + (v || 0);
        max = Math.max(max, top);
        if (v > 0) min = Math.min(min, v);
        return [t, v, base, top];
      });
      return { ...s, pts };
    });
    const log = this.isLog();
    if (this.scaleButton) this.scaleButton.classList.toggle('on', log);
    let y, ticks;
    if (log) {
      const lo = 10 ** Math.floor(Math.log10(min === Infinity ? 1 : min)), hi = 10 ** Math.ceil(Math.log10(Math.max(max, lo * 10)));
      y = (v) => top + h - ((Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) * h;
      ticks = [];
      for (let v = lo; v <= hi * 1.0001; v *= 10) ticks.push(v);
    } else {
      if (this.max !== null) max = Math.max(this.max, max);
      const step = niceStep(max > 0 ? max : 1, 4, this.binary);
      const ceiling = Math.max(step, Math.ceil((max * (1 - 1e-12)) / step) * step);
      y = (v) => top + h - (v / ceiling) * h;
      ticks = [];
      for (let v = 0; v <= ceiling * 1.0001; v += step) ticks.push(v);
    }
    const x = (t) => left + ((t - from) / this.span) * w;
    ctx.strokeStyle = '#30363d'; ctx.fillStyle = '#8b949e'; ctx.font = '11px system-ui'; ctx.lineWidth = 1;
    for (const v of ticks) {
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(left + w, yy); ctx.stroke();
      ctx.textAlign = 'right'; ctx.fillText(this.axis(v), left - 6, yy + 4, left - 8);
    }
    this.canvas.dataset.ticks = JSON.stringify(ticks);
    this.canvas.dataset.scale = log ? 'log' : 'linear';
    const step = niceStep(this.span, 6);
    ctx.textAlign = 'center';
    for (let ago = step; ago < this.span; ago += step) {
      if (x(now - ago) > left + 20) ctx.fillText(`−${Math.round(ago)} s`, x(now - ago), height - 4);
    }
    ctx.textAlign = 'right';
    ctx.fillText('now', left + w, height - 4);
    // Lines are drawn first to last, each thinner than the one before (by 2 px), so a
    // series that coincides with a later one still shows as a band around it (at most
    // three such steps).
    const lines = shapes.filter((s) => s.pts.length > 0).length;
    let drawn = 0;
    for (const s of (this.stacked ? [...shapes].reverse() : shapes)) {
      if (s.pts.length === 0) continue;
      ctx.strokeStyle = s.color; ctx.lineWidth = this.stacked ? 1.5 : 1.5 + 2 * Math.min(3, lines - 1 - drawn++);
      if (this.stacked) {
        ctx.beginPath();
        s.pts.forEach(([t, , , tp], i) => (i ? ctx.lineTo(x(t), y(tp)) : ctx.moveTo(x(t), y(tp))));
        for (let i = s.pts.length - 1; i >= 0; i--) ctx.lineTo(x(s.pts[i][0]), y(s.pts[i][2]));
        ctx.closePath(); ctx.globalAlpha = 0.55; ctx.fillStyle = s.color; ctx.fill(); ctx.globalAlpha = 1;
      } else {
        ctx.beginPath();
        let drawing = false;
        for (const [t, v] of s.pts) {
          if (v === null || v === undefined || (log && !(v > 0))) { drawing = false; continue; }
          if (drawing) ctx.lineTo(x(t), y(v)); else ctx.moveTo(x(t), y(v));
          drawing = true;
        }
        ctx.stroke();
      }
    }
    if (this.hover !== null && this.hover !== undefined && this.hover > left) {
      const t = from + ((this.hover - left) / w) * this.span;
      ctx.strokeStyle = '#8b949e'; ctx.beginPath(); ctx.moveTo(this.hover + 0.5, top); ctx.lineTo(this.hover + 0.5, top + h); ctx.stroke();
      const lines = [`${(now - t).toFixed(1)} s ago`, ...shapes.map((s) => {
        let best = null;
        for (const p of s.pts) if (best === null || Math.abs(p[0] - t) < Math.abs(best[0] - t)) best = p;
        return best ? `${s.name}: ${best[1] === null || best[1] === undefined ? NA : this.format(best[1])}` : `${s.name}: ${NA}`;
      })];
      ctx.font = '12px system-ui';
      const boxW = Math.max(...lines.map((l) => ctx.measureText(l).width)) + 14, boxH = lines.length * 15 + 8;
      const bx = this.hover + 12 + boxW > width ? this.hover - 12 - boxW : this.hover + 12;
      ctx.fillStyle = 'rgba(13, 17, 23, 0.92)'; ctx.strokeStyle = '#30363d';
      ctx.fillRect(bx, top, boxW, boxH); ctx.strokeRect(bx + 0.5, top + 0.5, boxW, boxH);
      ctx.textAlign = 'left';
      lines.forEach((line, i) => { ctx.fillStyle = i === 0 ? '#8b949e' : '#e6edf3'; ctx.fillText(line, bx + 7, top + 16 + i * 15); });
      this.canvas.dataset.tooltip = lines.join('\n');
    }
    this.legend.replaceChildren(...this.series.map((s) => {
      const last = [...s.points].reverse().find(([, v]) => v !== null && v !== undefined);
      return el('span', {}, swatch(s.color), `${s.name} ${last ? this.format(last[1]) : NA}`);
    }));
  }
}

function swatch(color) { const i = el('i'); i.style.background = color; return i; }

// A table whose columns sort on a click: columns = [{key, label, format, text}].
export function sortableTable(columns, rows, { sortKey, descending = true, id } = {}) {
  let key = sortKey ?? columns[0].key, desc = descending;
  const table = el('table', { id });
  const render = () => {
    const sorted = [...rows].sort((a, b) => {
      const x = a[key], y = b[key];
      const c = typeof x === 'string' || typeof y === 'string' ? String(x ?? '').localeCompare(String(y ?? '')) : (x ?? -Infinity) - (y ?? -Infinity);
      return desc ? -c : c;
    });
    const head = el('tr', {}, columns.map((c) => el('th', {
      class: `sortable ${c.text ? 'text' : ''} ${c.key === key ? (desc ? 'sorted-desc' : 'sorted-asc') : ''}`,
      dataset: { key: c.key },
      onclick: () => { if (key === c.key) desc = !desc; else { key = c.key; desc = !c.text; } render(); },
    }, c.label)));
    const body = sorted.map((r) => el('tr', {}, columns.map((c) => el('td', { class: c.text ? 'text' : '' }, c.format ? c.format(r[c.key], r) : r[c.key]))));
    table.replaceChildren(el('thead', {}, head), el('tbody', {}, body));
  };
  render();
  return table;
}

export function figure(label, value, cls) {
  return el('div', { class: 'figure' }, el('b', { class: cls }, value), el('span', {}, label));
}
