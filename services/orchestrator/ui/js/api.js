// The orchestrator's API as the page uses it. Every URL is relative to the page (…/ui/ -> …/v1/), so the page works
// on the service's own port, under `tasmoe serve all` (/orchestrator/ui/) and behind a proxy prefix alike.
//
// The user's API key (TASMOE_AUTH=keys) is typed into the page and kept in sessionStorage (this tab only); fetch()
// sends it as a bearer header. Where the browser cannot send a header (EventSource, <img>, download links) the page
// asks for a link token of the one experiment it shows and puts that in the URL instead (shared/link_tokens.py).

export const API = new URL('../v1/', location.href);
const KEY = 'tasmoe.key';

export const getKey = () => sessionStorage.getItem(KEY) || '';
export function setKey(key) {
  if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY);
  tokens.clear();
}

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || 'http_error';
    this.field = err.field || null;
  }
}

export async function api(path, { method = 'GET', body, signal } = {}) {
  const headers = { Accept: 'application/json' };
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const resp = await fetch(new URL(path, API), {
    method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

export const expPath = (id, sub = '') => `experiments/${encodeURIComponent(id)}${sub}`;

// link tokens, one per experiment, renewed a minute before they expire
const tokens = new Map();

export async function linkToken(id) {
  const held = tokens.get(id);
  if (held && held.until - Date.now() > 60_000) return held.token;
  const got = await api(expPath(id, '/token'));
  tokens.set(id, { token: got.token, until: Date.now() + got.ttl_s * 1000 });
  return got.token;
}

export function forgetToken(id) { tokens.delete(id); }

// a URL of the experiment's own read-only paths with its link token (for EventSource, <img>, <a download>)
export async function linkUrl(id, sub, params = {}) {
  const url = new URL(expPath(id, sub), API);
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) url.searchParams.set(k, v);
  url.searchParams.set('token', await linkToken(id));
  return url.href;
}

export const openapiUrl = () => new URL('../openapi.json', API).href;
