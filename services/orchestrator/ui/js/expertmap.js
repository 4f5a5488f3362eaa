// The expert map: the mesh of cores with the experts each one runs and the weight shards in its vault, and TACS's
// moves of the last windows as arrows (migration: solid orange; a weight shard's move: purple; a reroute that is not
// a migration's own: dashed blue), fading with age. The arrows are also listed in text beside it.
import { canvas2d, el } from './dom.js';

const KIND = {
  migrate: { colour: '#e8590c', dash: [] },
  shard: { colour: '#7048e8', dash: [] },
  reroute: { colour: '#1c7ed6', dash: [5, 4] },
};

function arrow(ctx, x0, y0, x1, y1, size) {
  const a = Math.atan2(y1 - y0, x1 - x0);
  ctx.beginPath(); ctx.moveTo(x0, y0); ctx.lineTo(x1, y1); ctx.stroke();
  ctx.setLineDash([]);
  ctx.beginPath();
  ctx.moveTo(x1, y1);
  ctx.lineTo(x1 - size * Math.cos(a - 0.4), y1 - size * Math.sin(a - 0.4));
  ctx.lineTo(x1 - size * Math.cos(a + 0.4), y1 - size * Math.sin(a + 0.4));
  ctx.closePath(); ctx.fill();
}

// the moves worth an arrow: a reroute made for a migration is drawn by its migration
export const drawnMoves = (moves) => moves.filter((m) => !(m.kind === 'reroute' && m.reason === 'migrate'));

// map: GET .../map answer; window: the window shown; span: how many windows an arrow stays
export function drawExpertMap(cv, list, map, window, span, size = 30) {
  const [X, Y] = map.mesh;
  const ctx = canvas2d(cv, X * size, Y * size);
  const most = Math.max(1, ...map.experts.map((e) => e.length));
  ctx.font = `${Math.floor(size / 2.6)}px system-ui, sans-serif`;
  ctx.textAlign = 'center';
  ctx.textBaseline = 'middle';
  map.experts.forEach((experts, c) => {
    const x = (c % X) * size;
    const y = Math.floor(c / X) * size;
    const t = experts.length / most;
    ctx.fillStyle = `rgba(25, 113, 194, ${0.08 + 0.6 * t})`;
    ctx.fillRect(x, y, size - 1, size - 1);
    ctx.fillStyle = t > 0.6 ? '#fff' : '#123';
    if (experts.length) ctx.fillText(String(experts.length), x + size / 2, y + size / 2 - 2);
    if (map.shards[c]) {
      ctx.fillStyle = '#555';
      ctx.font = `${Math.floor(size / 3.6)}px system-ui, sans-serif`;
      ctx.fillText(String(map.shards[c]), x + size - 7, y + size - 6);
      ctx.font = `${Math.floor(size / 2.6)}px system-ui, sans-serif`;
    }
  });
  const centre = (c) => [((c % X) + 0.5) * size, (Math.floor(c / X) + 0.5) * size];
  const shown = drawnMoves(map.moves).filter((m) => m.window <= window && m.window > window - span);
  for (const m of shown) {
    const k = KIND[m.kind] || KIND.reroute;
    const [x0, y0] = centre(m.from);
    const [x1, y1] = centre(m.to);
    ctx.globalAlpha = Math.max(0.25, 1 - (window - m.window) / span);
    ctx.strokeStyle = k.colour; ctx.fillStyle = k.colour; ctx.lineWidth = 2.5; ctx.setLineDash(k.dash);
    arrow(ctx, x0, y0, x1, y1, size / 3);
  }
  ctx.globalAlpha = 1;
  cv.dataset.arrows = String(shown.length);
  cv.title = map.experts.map((e, c) => (e.length ? `core ${c}: ${e.join(' ')}` : '')).filter(Boolean).join('\n');
  const why = (m) => (m.reason && m.reason !== 'migrate' ? ` (${m.reason})` : '');
  list.replaceChildren(...shown.slice(-12).reverse().map((m) => el('li', { dataset: { kind: m.kind } },
    `w${m.window}: ${m.kind} ${m.obj} core ${m.from} → ${m.to}${why(m)}`)));
  if (!shown.length) {
    list.append(el('li', { class: 'muted' }, `no TACS move in windows ${Math.max(0, window - span + 1)}–${window}`));
  }
}
