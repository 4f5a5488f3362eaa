// The experiments: status, each scenario's progress, an ETA, the reason of a failure or a wait. Refreshed every 3 s.
import { api } from './api.js';
import { badge, duration, el, when } from './dom.js';

// seconds left for one run at its pace so far: its windows over the wall time its window loop took (compute_s;
// the placement and the warm-up before window 0 not counted), or NaN before its first window
export function runEta(run) {
  if (run.status !== 'running' || !run.n_windows || run.window <= 0 || !(run.compute_s > 0)) return NaN;
  return ((run.n_windows - run.window) * run.compute_s) / run.window;
}

export function progressBar(run) {
  const frac = run.n_windows ? Math.min(1, run.window / run.n_windows) : 0;
  const bar = el('div', { class: 'bar', title: run.progress },
    el('div', { class: `fill ${run.status}`, style: `width:${(100 * frac).toFixed(1)}%` }));
  return el('div', { class: 'run-progress', dataset: { scenario: run.scenario } },
    el('span', { class: 'scn' }, run.scenario), bar, el('span', { class: 'muted small' }, run.progress));
}

// the experiment's state in words: ETA while running, the wait's reason, the failure's reason
export function stateText(exp) {
  const waiting = exp.runs.filter((r) => r.status === 'waiting');
  if (waiting.length) return `waiting: ${waiting[0].waiting}`;
  if (exp.status === 'failed') return exp.error || exp.runs.find((r) => r.error)?.error || 'failed';
  if (exp.status === 'running') {
    const etas = exp.runs.map((r) => runEta(r)).filter(Number.isFinite);
    const queued = exp.runs.some((r) => r.status === 'queued');
    if (etas.length) return `ETA ${duration(Math.max(...etas))}${queued ? ' (then the queued runs)' : ''}`;
    if (exp.runs.some((r) => r.status === 'running')) return 'starting (placement, warm-up)';
    return 'queued runs wait for a worker';
  }
  if (exp.status === 'queued') return 'queued';
  return '';
}

export async function showList(main) {
  const body = el('tbody');
  const total = el('span', { class: 'muted' });
  main.append(
    el('div', { class: 'row' }, el('h1', {}, 'Experiments'), total,
      el('a', { class: 'button', href: '#/new' }, 'New experiment')),
    el('table', { class: 'list', id: 'experiments' },
      el('thead', {}, el('tr', {}, ['Experiment', 'Status', 'Progress', 'State', 'Created']
        .map((h) => el('th', {}, h)))),
      body));
  async function refresh() {
    const page = await api('experiments?limit=50');
    const more = page.total > page.items.length ? `, the newest ${page.items.length}` : '';
    total.textContent = `${page.total} in all${more}`;
    body.replaceChildren(...page.items.map((exp) => el('tr', { dataset: { id: exp.id, status: exp.status } },
      el('td', {}, el('a', { href: `#/exp/${exp.id}` }, exp.name || exp.id),
        el('div', { class: 'muted small' }, exp.id)),
      el('td', {}, badge(exp.status)),
      el('td', {}, exp.runs.map(progressBar)),
      el('td', { class: 'state' }, stateText(exp)),
      el('td', { class: 'small' }, when(exp.created_at)))));
    if (!page.items.length) body.append(el('tr', {}, el('td', { colspan: 5, class: 'muted' }, 'No experiment yet.')));
  }
  await refresh();
  const timer = setInterval(() => { if (!document.hidden) refresh().catch(() => {}); }, 3000);
  return () => clearInterval(timer);
}
