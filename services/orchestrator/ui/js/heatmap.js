// Heat maps on plain Canvas: a die as a grid of cells (row-major, cell = y * X + x, y = 0 on top) coloured on ONE
// scale for the whole experiment, and the scale's bar with Thot and the 85 °C refresh step marked.
import { canvas2d } from './dom.js';

// a sequential map, dark (cool) to light (hot): colour stops sampled from matplotlib's "inferno" (CC0, by
// Nathaniel Smith and Stéfan van der Walt), interpolated linearly
const STOPS = [[0, 0, 4], [40, 11, 84], [101, 21, 110], [159, 42, 99], [212, 72, 66], [245, 125, 21],
  [250, 193, 39], [252, 255, 164]];

export function colour(t) {
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const c = STOPS[i].map((v, k) => Math.round(v + f * (STOPS[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

export const scaled = (v, scale) => (v - scale.lo) / (scale.hi - scale.lo);

// values: one per cell; opts: {size (px per cell), marks: {thot}, labels: bool}; returns the hottest cell's index
export function drawHeatmap(cv, values, X, Y, scale, opts = {}) {
  const size = opts.size || 24;
  const ctx = canvas2d(cv, X * size, Y * size);
  let hot = 0;
  values.forEach((v, i) => { if (v > values[hot]) hot = i; });
  for (let i = 0; i < X * Y; i++) {
    const x = i % X;
    const y = Math.floor(i / X);
    ctx.fillStyle = values[i] === undefined ? '#ccc' : colour(scaled(values[i], scale));
    ctx.fillRect(x * size, y * size, size, size);
    if (opts.thot !== undefined && values[i] >= opts.thot && size >= 10) { // past Thot: a cyan frame
      ctx.strokeStyle = '#00e5ff';
      ctx.lineWidth = Math.max(1, size / 14);
      ctx.strokeRect(x * size + 1.5, y * size + 1.5, size - 3, size - 3);
    }
  }
  if (opts.labels && size >= 26) {
    ctx.font = `${Math.floor(size / 3.2)}px system-ui, sans-serif`;
    ctx.textAlign = 'center';
    ctx.textBaseline = 'middle';
    values.forEach((v, i) => {
      ctx.fillStyle = scaled(v, scale) > 0.6 ? '#000' : '#fff';
      ctx.fillText(v.toFixed(1), (i % X + 0.5) * size, (Math.floor(i / X) + 0.5) * size);
    });
  }
  ctx.strokeStyle = '#fff'; // the hottest cell
  ctx.lineWidth = 2;
  ctx.strokeRect((hot % X) * size + 1, Math.floor(hot / X) * size + 1, size - 2, size - 2);
  cv.dataset.max = values.length ? values[hot].toFixed(2) : '';
  cv.dataset.hot = String(hot);
  return hot;
}

// the colour bar: the scale in °C, ticks every 5 or 10 K, marks (e.g. Thot, the 85 °C refresh step) as lines
export function drawColourbar(cv, scale, marks, width = 440) {
  const h = 46;
  const ctx = canvas2d(cv, width, h);
  const pad = 12;
  const w = width - 2 * pad - 16;
  for (let i = 0; i < w; i++) {
    ctx.fillStyle = colour(i / (w - 1));
    ctx.fillRect(pad + i, 4, 1, 14);
  }
  ctx.fillStyle = '#333';
  ctx.font = '11px system-ui, sans-serif';
  ctx.textAlign = 'center';
  const span = scale.hi - scale.lo;
  const step = span > 60 ? 20 : span > 30 ? 10 : 5;
  for (let t = Math.ceil(scale.lo / step) * step; t <= scale.hi; t += step) {
    const x = pad + ((t - scale.lo) / span) * w;
    ctx.fillRect(x, 18, 1, 4);
    ctx.fillText(`${t}`, x, 32);
  }
  const below = marks.filter((m) => m.value < scale.lo);
  const above = marks.filter((m) => m.value > scale.hi);
  const inside = marks.filter((k) => k.value >= scale.lo && k.value <= scale.hi).sort((a, b) => a.value - b.value);
  inside.forEach((m, i) => { // a label left of its line, or right of it when the next mark is near
    const x = pad + ((m.value - scale.lo) / span) * w;
    const next = inside[i + 1];
    const near = next && ((next.value - m.value) / span) * w < 90;
    const prevNear = i > 0 && ((m.value - inside[i - 1].value) / span) * w < 90;
    ctx.fillStyle = m.colour;
    ctx.fillRect(x - 1, 0, 2, 22);
    ctx.textAlign = near ? 'right' : prevNear ? 'left' : 'center';
    ctx.fillText(m.label, near ? x - 3 : prevNear ? x + 3 : Math.min(width - 40, Math.max(40, x)), 44);
  });
  ctx.fillStyle = '#555'; // marks outside the scale: named at the bar's edge, pointing where they lie
  const names = (ms) => ms.map((m) => m.label).join(', ');
  if (below.length) { ctx.textAlign = 'left'; ctx.fillText(`◂ below: ${names(below)}`, 0, 44); }
  if (above.length) { ctx.textAlign = 'right'; ctx.fillText(`above: ${names(above)} ▸`, width, 44); }
  ctx.fillStyle = '#333';
  ctx.textAlign = 'left';
  ctx.fillText('°C', pad + w + 6, 15);
}
