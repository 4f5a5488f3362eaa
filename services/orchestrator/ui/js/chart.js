// Line charts on plain Canvas: simulated time on x (ms), one line per series, horizontal marks (Thot, 85 °C), a cursor
// at the window shown; a click reports the time clicked (the page scrubs there).
import { canvas2d } from './dom.js';

export const SCENARIO_COLOURS = { baseline: '#555555', taps: '#1f77b4', tacs: '#ff7f0e', tas: '#2ca02c' };
export const PART_COLOURS = ['#1f77b4', '#aec7e8', '#ff7f0e', '#ffbb78', '#2ca02c', '#d62728', '#9467bd', '#8c564b'];

function ticks(lo, hi, n = 5) {
  const span = hi - lo || 1;
  const raw = span / n;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((k) => k * mag).find((s) => span / s <= n) || 10 * mag;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) out.push(t);
  out.decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9)); // as many as the step needs
  return out;
}

const label = (v, decimals) => v.toFixed(Math.min(decimals, 6));

// opts: {title, unit, series: [{name, colour, xs, ys}], marks: [{y, label, colour}], cursor (x), onPick(x)}
export function lineChart(cv, opts, width = 460, height = 170) {
  const ctx = canvas2d(cv, width, height);
  const wide = opts.series.length > 4; // a long legend goes on a line of its own
  const m = { l: 52, r: 10, t: wide ? 34 : 22, b: 24 };
  const w = width - m.l - m.r;
  const h = height - m.t - m.b;
  const xs = opts.series.flatMap((s) => s.xs);
  const ys = opts.series.flatMap((s) => s.ys).filter((v) => v !== null && Number.isFinite(v));
  const x0 = xs.length ? Math.min(...xs) : 0;
  const x1 = xs.length ? Math.max(...xs, x0 + 1e-9) : 1;
  let y0 = ys.length ? Math.min(...ys) : 0;
  let y1 = ys.length ? Math.max(...ys) : 1;
  for (const mk of opts.marks || []) if (ys.length && mk.y > y0 - 0.2 * (y1 - y0) && mk.y < y1 + 0.2 * (y1 - y0)) {
    y0 = Math.min(y0, mk.y); y1 = Math.max(y1, mk.y);
  }
  if (y1 - y0 < 1e-9) { y0 -= 1; y1 += 1; }
  const pad = 0.05 * (y1 - y0);
  y0 -= pad; y1 += pad;
  const px = (x) => m.l + ((x - x0) / (x1 - x0 || 1)) * w;
  const py = (y) => m.t + h - ((y - y0) / (y1 - y0)) * h;
  ctx.font = '11px system-ui, sans-serif';
  ctx.fillStyle = '#222';
  ctx.textAlign = 'left';
  ctx.fillText(`${opts.title}${opts.unit ? ` (${opts.unit})` : ''}`, m.l, 13);
  ctx.strokeStyle = '#ddd';
  ctx.fillStyle = '#555';
  ctx.lineWidth = 1;
  ctx.textAlign = 'right';
  const yt = ticks(y0, y1, 4);
  for (const t of yt) {
    ctx.beginPath(); ctx.moveTo(m.l, py(t)); ctx.lineTo(m.l + w, py(t)); ctx.stroke();
    ctx.fillText(label(t, yt.decimals), m.l - 4, py(t) + 4);
  }
  ctx.textAlign = 'center';
  const xt = ticks(x0, x1, 6);
  for (const t of xt) ctx.fillText(label(t, xt.decimals), px(t), height - 8);
  ctx.textAlign = 'right';
  ctx.fillText('ms', width - 2, height - 8);
  for (const mk of opts.marks || []) {
    if (mk.y < y0 || mk.y > y1) continue;
    ctx.strokeStyle = mk.colour; ctx.setLineDash([4, 3]);
    ctx.beginPath(); ctx.moveTo(m.l, py(mk.y)); ctx.lineTo(m.l + w, py(mk.y)); ctx.stroke();
    ctx.setLineDash([]); ctx.fillStyle = mk.colour; ctx.textAlign = 'left';
    ctx.fillText(mk.label, m.l + 3, py(mk.y) - 3);
  }
  let lx = width - m.r;
  ctx.textAlign = 'right';
  for (const s of [...opts.series].reverse()) { // the legend, right-aligned on the title line (or the next)
    ctx.fillStyle = s.colour;
    ctx.fillText(s.name, lx, wide ? 27 : 13);
    lx -= ctx.measureText(s.name).width + 8;
  }
  for (const s of opts.series) {
    ctx.strokeStyle = s.colour;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let pen = false;
    s.xs.forEach((x, i) => {
      const y = s.ys[i];
      if (y === null || !Number.isFinite(y)) { pen = false; return; }
      if (pen) ctx.lineTo(px(x), py(y)); else ctx.moveTo(px(x), py(y));
      pen = true;
    });
    ctx.stroke();
  }
  if (opts.cursor !== undefined && opts.cursor !== null && xs.length) {
    ctx.strokeStyle = '#d00';
    ctx.beginPath(); ctx.moveTo(px(opts.cursor), m.t); ctx.lineTo(px(opts.cursor), m.t + h); ctx.stroke();
  }
  cv.onclick = opts.onPick ? (ev) => {
    const r = cv.getBoundingClientRect();
    opts.onPick(x0 + ((ev.clientX - r.left - m.l) / w) * (x1 - x0));
  } : null;
}
