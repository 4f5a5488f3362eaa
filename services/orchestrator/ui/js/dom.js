// Small DOM and formatting helpers shared by the views.

// el('a', {href: '#/', class: 'x'}, 'text', child, ...): an element; attributes starting with "on" are listeners
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else if (k === 'style') node.style.cssText = v; // CSSOM, which the page's content security policy allows
    else node.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export function notice(text, kind = 'error') {
  const box = document.getElementById('notice');
  box.textContent = text;
  box.className = `notice ${kind}`;
  box.hidden = !text;
}

export const fmt = (x, nd = 2) => (x === null || x === undefined || Number.isNaN(x) ? '–' : Number(x).toFixed(nd));

export function duration(s) {
  if (!Number.isFinite(s) || s < 0) return '–';
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export const when = (iso) => (iso ? new Date(iso).toLocaleString() : '–');

// a status as a coloured badge: queued, running, waiting (an outage), succeeded, failed, cancelled
export const badge = (status) => el('span', { class: `badge ${status}` }, status);

// a canvas sized for the device's pixels; returns its 2D context scaled to CSS pixels
export function canvas2d(cv, width, height) {
  const dpr = window.devicePixelRatio || 1;
  cv.width = Math.round(width * dpr);
  cv.height = Math.round(height * dpr);
  cv.style.width = `${width}px`;
  cv.style.height = `${height}px`;
  const ctx = cv.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}
