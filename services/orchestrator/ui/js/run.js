// One experiment: its runs' progress; the scenarios side by side (the logic die and each DRAM die as heat maps on the
// experiment's one colour scale, the expert map with TACS's moves); timelines of the decimated series; live over the
// event stream while it runs, and a scrubber that replays any stored window (read back, never recomputed).
import { api, expPath, forgetToken, linkUrl } from './api.js';
import { PART_COLOURS, SCENARIO_COLOURS, lineChart } from './chart.js';
import { badge, duration, el, fmt, notice } from './dom.js';
import { drawColourbar, drawHeatmap } from './heatmap.js';
import { drawExpertMap } from './expertmap.js';
import { progressBar, runEta, stateText } from './list.js';

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const SPAN = 20; // windows an arrow of a TACS move stays on the map
const POINTS = 600; // timeline buckets asked of the server
const MAP_FIELDS = 'window,t_start_ms,temps_core_c,temps_bank_c,T_peak_logic,T_peak_dram';
const PARTS = ['logic_dynamic', 'spm', 'logic_leakage', 'noc', 'dram_controller', 'dram_dynamic', 'dram_refresh',
  'dram_leakage'];

export async function showRun(main, id) {
  // follow: live (every scenario at the slowest running one's newest window) or replay (all at `window`); cursor: the
  // stream's window per scenario; latest: its newest frame; shown: the window read back; maps: expert maps; cols:
  // timeline columns
  const S = { id, exp: await api(expPath(id)), follow: true, window: 0, cursor: {}, latest: {}, shown: {}, maps: {},
    cols: {} };
  const stop = { closed: false }; // set when the user leaves the page: no reconnect then
  let es = null;

  // ------------------------------------------------------------------ layout
  const head = el('div', { class: 'row' });
  const runsBox = el('div', { class: 'runs' });
  const scrub = el('input', { type: 'range', id: 'scrub', min: 0, max: 0, value: 0, step: 1 });
  const clock = el('span', { id: 'clock', class: 'clock' });
  const followBtn = el('button', { type: 'button', id: 'follow' }, 'follow live');
  const bar = el('canvas', { id: 'colourbar' });
  const cols = el('div', { class: 'scenarios' });
  const charts = el('div', { class: 'timelines' });
  const partSel = el('select', { id: 'part-scenario' });
  const finished = el('section', { class: 'finished' });
  const tracePanel = el('section', { class: 'trace' });
  main.append(head, runsBox,
    el('div', { class: 'row clockrow' }, el('label', {}, 'window ', scrub), clock, followBtn),
    el('div', { class: 'row' }, bar, el('span', { class: 'muted small' },
      'one colour scale for every die and scenario of the experiment; cyan frame: past Thot; white: hottest cell')),
    cols, el('h2', {}, 'Timelines'), el('p', { class: 'muted small' },
      'Decimated on the server (peaks: each bucket\'s maximum). Click a chart to replay that window.'),
    el('div', { class: 'row' }, el('label', {}, 'power by component of ', partSel)), charts, tracePanel, finished);

  function renderHead() {
    const e = S.exp;
    head.replaceChildren(el('h1', {}, e.name || e.id), badge(e.status), el('span', { class: 'muted' }, e.id),
      el('span', { class: 'state', id: 'state' }, stateText(e)));
    runsBox.replaceChildren(...e.runs.map((r) => el('div', { class: 'run-line' }, progressBar(r),
      el('span', { class: 'small muted eta' }, Number.isFinite(runEta(r)) ? `ETA ${duration(runEta(r))}` : ''),
      r.error ? el('span', { class: 'error small' }, r.error) : null,
      r.waiting ? el('span', { class: 'waiting small' }, `waiting: ${r.waiting}`) : null)));
    for (const r of e.runs) { // a pane without a window yet says why
      if (ui[r.scenario] && !S.latest[r.scenario] && !S.shown[r.scenario] && r.window === 0) {
        ui[r.scenario].where.textContent = { queued: 'queued', running: 'placement, warm-up…' }[r.status] || r.status;
      }
    }
    const actions = el('span', { class: 'actions' });
    const button = (what, text) => el('button', { type: 'button', onclick: () => act(what) }, text);
    if (!TERMINAL.has(e.status)) actions.append(button('cancel', 'Cancel'));
    if (e.status === 'failed') actions.append(button('retry', 'Retry failed runs'));
    head.append(actions);
  }
  async function act(what) {
    try {
      S.exp = await api(expPath(id, `/${what}`), { method: 'POST' });
      renderHead();
      if (what === 'retry') connect();
    } catch (err) { notice(err.message); }
  }

  // ------------------------------------------------------------------ scenario columns
  const scenarios = S.exp.runs.map((r) => r.scenario);
  const ui = {}; // each scenario's pane
  for (const sc of scenarios) {
    partSel.append(el('option', { value: sc }, sc));
    const dies = el('div', { class: 'dies' });
    ui[sc] = {
      where: el('span', { class: 'where muted small' }),
      peak: el('div', { class: 'peak small' }),
      logic: el('canvas', { class: 'logic', dataset: { scenario: sc } }),
      dies,
      map: el('canvas', { class: 'expert-map', dataset: { scenario: sc } }),
      moves: el('ul', { class: 'moves small' }),
    };
    const u = ui[sc];
    cols.append(el('div', { class: 'scenario', dataset: { scenario: sc } },
      el('h3', { style: `color:${SCENARIO_COLOURS[sc]}` }, sc, ' ', u.where), u.peak,
      el('div', { class: 'cap small' }, 'logic die: core temperatures'), u.logic,
      el('div', { class: 'cap small' }, 'DRAM dies (vaults), 1 = next to the logic die'), dies,
      el('div', { class: 'cap small' }, 'experts per core (number), shards per vault (corner); TACS moves'),
      u.map, u.moves));
  }

  const marks = () => [{ value: S.chip.thot_c, label: `Thot ${S.chip.thot_c}`, colour: '#00b8d4' },
    { value: S.chip.refresh_step_c, label: `${S.chip.refresh_step_c} °C refresh`, colour: '#c2255c' }];

  function widenScale(values) {
    if (!S.scale) { // the experiment's first window: the scale starts from it (5 K steps, 10 K at least)
      const lo = 5 * Math.floor(Math.min(...values) / 5);
      S.scale = { lo, hi: Math.max(lo + 10, 5 * Math.ceil(Math.max(...values) / 5)) };
      drawBar();
      return true;
    }
    let { lo, hi } = S.scale;
    for (const v of values) { if (v < lo) lo = 5 * Math.floor(v / 5); if (v > hi) hi = 5 * Math.ceil(v / 5); }
    if (lo !== S.scale.lo || hi !== S.scale.hi) { S.scale = { lo, hi }; drawBar(); return true; }
    return false;
  }
  function drawBar() {
    if (!S.scale) return;
    drawColourbar(bar, S.scale, marks());
    bar.dataset.lo = S.scale.lo; bar.dataset.hi = S.scale.hi;
  }

  // the maps of one scenario for one window (w: WindowMetrics subset or a live frame)
  function drawMaps(sc, w, source) {
    const u = ui[sc];
    const [X, Y] = S.chip.mesh;
    if (!w) {
      const run = S.exp.runs.find((r) => r.scenario === sc);
      u.where.textContent = run && run.status === 'queued' ? 'queued' : 'no window yet';
      return;
    }
    const bank = w.temps_bank_c || [];
    if (widenScale([...w.temps_core_c, ...bank.flat()])) redrawOthers(sc);
    const cell = Math.max(6, Math.floor(216 / X));
    drawHeatmap(u.logic, w.temps_core_c, X, Y, S.scale, { size: cell, thot: S.chip.thot_c, labels: true });
    Object.assign(u.logic.dataset, { window: w.window, source, peak: fmt(w.T_peak_logic) });
    if (source === 'stream') u.logic.dataset.frames = String(Number(u.logic.dataset.frames || 0) + 1);
    const t = fmt(w.t_ms ?? w.t_start_ms, 0);
    u.where.textContent = `window ${w.window} · t = ${t} ms · peak ${fmt(w.T_peak_logic)} / ${fmt(w.T_peak_dram)} °C`;
    const dies = bank.length ? bank[0].length : 0;
    while (u.dies.children.length < dies) {
      const k = u.dies.children.length;
      u.dies.append(el('figure', {}, el('canvas', { class: 'die', dataset: { die: k + 1 } }),
        el('figcaption', {}, `die ${k + 1}`)));
    }
    for (let d = 0; d < dies; d++) {
      drawHeatmap(u.dies.children[d].firstChild, bank.map((v) => v[d]), X, Y, S.scale,
        { size: Math.max(2, Math.floor(52 / X)), thot: S.chip.thot_c });
    }
  }

  // the scale widened: the other scenarios' maps again on it
  function redrawOthers(except) {
    for (const sc of scenarios) {
      const w = ui[sc].logic.dataset.source === 'stream' ? S.latest[sc] : S.shown[sc];
      if (sc !== except && w) drawMaps(sc, w, ui[sc].logic.dataset.source);
    }
  }

  async function drawMap(sc, window) {
    const map = await api(expPath(id, `/map?scenario=${sc}&window=${window}&span=${SPAN}`));
    S.maps[sc] = map;
    drawExpertMap(ui[sc].map, ui[sc].moves, map, map.window, SPAN, Math.max(6, Math.floor(216 / map.mesh[0])));
    ui[sc].map.dataset.window = map.window;
  }

  // ------------------------------------------------------------------ timelines
  function showPeaks() {
    for (const sc of scenarios) {
      const p = S.cols[sc];
      if (!p || !p.T_peak_logic || !p.T_peak_logic.length) { ui[sc].peak.textContent = ''; continue; }
      const best = (key) => p[key].reduce((b, v, i) => (v > p[key][b] ? i : b), 0);
      const i = best('T_peak_logic');
      const j = best('T_peak_dram');
      const logicW = p.T_peak_logic_w[i];
      const dramW = p.T_peak_dram_w[j];
      ui[sc].peak.replaceChildren(
        el('a', { href: '#', class: 'peak-logic', dataset: { value: fmt(p.T_peak_logic[i]), window: logicW },
          onclick: (ev) => { ev.preventDefault(); replay(logicW); } },
          `peak logic ${fmt(p.T_peak_logic[i])} °C at window ${logicW}`), ' · ',
        el('a', { href: '#', class: 'peak-dram', dataset: { value: fmt(p.T_peak_dram[j]), window: dramW },
          onclick: (ev) => { ev.preventDefault(); replay(dramW); } },
          `DRAM ${fmt(p.T_peak_dram[j])} °C at window ${dramW}`));
    }
  }

  const chartDefs = [
    { key: 'T_peak_logic', title: 'peak logic temperature', unit: '°C', marks: true },
    { key: 'T_peak_dram', title: 'peak DRAM temperature', unit: '°C', marks: true },
    { key: 'ips', title: 'throughput', unit: 'tok/s' },
    { key: 'lat_ms', title: 'mean token latency', unit: 'ms' },
    { key: 'power_w', title: 'chip power', unit: 'W' },
    { key: 'parts', title: 'power by component', unit: 'W' },
    { key: 'freq_ghz', title: 'DVFS: mean core clock', unit: 'GHz' },
    { key: 'refresh_mhz', title: 'DRAM refresh rate', unit: 'MHz' },
  ];
  const chartEls = Object.fromEntries(chartDefs.map((d) => [d.key,
    el('canvas', { class: 'chart', dataset: { chart: d.key } })]));
  charts.append(...Object.values(chartEls));
  let chartTimer = null;
  function drawCharts() {
    chartTimer = null;
    const mid = (p) => p.t0_ms.map((t, i) => (t + p.t1_ms[i]) / 2);
    const cursor = S.follow ? null : S.window * S.chip.window_ms + S.chip.window_ms / 2;
    const pick = (ms) => replay(Math.max(0, Math.floor(ms / S.chip.window_ms)));
    for (const d of chartDefs) {
      let series;
      if (d.key === 'parts') {
        const p = S.cols[partSel.value];
        series = !p || !p.t0_ms ? [] : PARTS.map((k, i) => ({
          name: k.replace('_', ' '), colour: PART_COLOURS[i], xs: mid(p), ys: p[`power_${k}_w`] }));
      } else {
        series = scenarios.filter((sc) => S.cols[sc] && S.cols[sc].t0_ms)
          .map((sc) => ({ name: sc, colour: SCENARIO_COLOURS[sc], xs: mid(S.cols[sc]), ys: S.cols[sc][d.key] }));
      }
      const mk = d.marks ? marks().map((m) => ({ y: m.value, label: m.label, colour: m.colour })) : [];
      lineChart(chartEls[d.key], { title: d.title, unit: d.unit, series, marks: mk, cursor, onPick: pick });
    }
    showPeaks();
  }
  const scheduleCharts = () => { if (!chartTimer) chartTimer = setTimeout(drawCharts, 500); };
  partSel.addEventListener('change', drawCharts);

  async function loadSeries() {
    const got = await api(expPath(id, `/series?points=${POINTS}`));
    S.chip = got.chip;
    S.scale = got.scale;
    for (const [sc, s] of Object.entries(got.scenarios)) {
      S.cols[sc] = s.points;
      S.cursor[sc] = s.stop;
    }
    drawBar();
    setScrubMax();
    drawCharts();
  }

  function appendBucket(sc, b) {
    const p = S.cols[sc] || (S.cols[sc] = {});
    if (!p.w0) for (const k of Object.keys(b)) p[k] = [];
    while (p.w0.length && p.w1[p.w1.length - 1] >= b.w0) for (const k of Object.keys(p)) p[k].pop(); // a reconnect
    for (const [k, v] of Object.entries(b)) (p[k] || (p[k] = [])).push(v);
  }

  // ------------------------------------------------------------------ the clock: live or replay
  function committed() { // the windows the longest run has committed
    return Math.max(0, ...S.exp.runs.map((r) => (r.status === 'succeeded' ? r.n_windows || r.window : r.window)));
  }
  function setScrubMax() { scrub.max = String(Math.max(0, committed() - 1)); if (S.follow) scrub.value = scrub.max; }
  // live, one clock for every scenario: the newest window of the slowest running one (of any, once none runs); a
  // scenario ahead of it is shown at that window from its store, the others from their frames
  function liveClock() {
    const seen = scenarios.filter((sc) => S.latest[sc]);
    const running = seen.filter((sc) => S.exp.runs.find((r) => r.scenario === sc).status === 'running');
    const pool = running.length ? running : seen;
    return pool.length ? Math.min(...pool.map((sc) => S.latest[sc].window)) : null;
  }

  function showClock() {
    const live = S.follow && !TERMINAL.has(S.exp.status);
    followBtn.hidden = S.follow || TERMINAL.has(S.exp.status);
    const at = live ? liveClock() : S.window;
    const t = at === null ? '' : ` (t = ${fmt(at * S.chip.window_ms, 0)} ms)`;
    clock.textContent = live ? `live: every scenario at window ${at ?? '–'}${t}, the slowest running one's newest`
      : `replay: window ${S.window}${t}, every scenario at it`;
    clock.dataset.mode = live ? 'live' : 'replay';
    clock.dataset.window = at ?? '';
  }

  // every scenario's maps at window `at` (those in `frames` from their live frame, the rest read back from the
  // store); one request in flight, the newest asked wins
  let want = null;
  let busy = false;
  async function showAt(at, source) {
    want = { at, source };
    if (busy) return;
    busy = true;
    try {
      while (want !== null) {
        const { at: w, source: src } = want;
        want = null;
        const fromFrame = src === 'stream' ? scenarios.filter((sc) => S.latest[sc] && S.latest[sc].window === w) : [];
        for (const sc of fromFrame) drawMaps(sc, S.latest[sc], 'stream');
        const drawn = [...fromFrame];
        const rest = scenarios.filter((sc) => !fromFrame.includes(sc));
        if (rest.length) {
          const got = await api(expPath(id, `/windows?offset=${w}&limit=1&fields=${MAP_FIELDS}`));
          for (const sc of rest) {
            const row = (got.scenarios[sc] || [])[0];
            if (src === 'stream' && !row) continue; // live: a run with no window there yet keeps its pane
            S.shown[sc] = row;
            drawMaps(sc, row, src === 'stream' ? 'clock' : 'replay');
            if (row) drawn.push(sc);
          }
        }
        // an expert map is asked again in a replay at each window, live only after moves or every SPAN windows
        const stale = (sc) => !S.maps[sc] || (src === 'stream'
          ? S.maps[sc].window < 0 || Math.abs(w - S.maps[sc].window) >= SPAN : S.maps[sc].window !== w);
        await Promise.all(drawn.filter(stale).map((sc) => drawMap(sc, w).catch(() => {})));
      }
    } catch (err) { notice(err.message); } finally { busy = false; }
  }

  function replay(w) {
    S.follow = false;
    S.window = Math.min(Number(w), Number(scrub.max));
    scrub.value = S.window;
    showClock();
    scheduleCharts();
    return showAt(S.window, 'replay');
  }
  scrub.addEventListener('input', () => replay(scrub.value));
  followBtn.addEventListener('click', () => {
    S.follow = true;
    showClock();
    scheduleCharts();
    const at = liveClock();
    if (at !== null) showAt(at, 'stream');
  });

  // ------------------------------------------------------------------ the stream
  function onFrame(f) {
    const sc = f.scenario;
    S.latest[sc] = f;
    S.cursor[sc] = f.committed;
    const run = S.exp.runs.find((r) => r.scenario === sc);
    if (run && f.committed > run.window) run.window = f.committed;
    if (f.summary) appendBucket(sc, f.summary);
    if (f.moves.length && S.maps[sc]) S.maps[sc].window = -1; // its map is redrawn with the new moves
    setScrubMax();
    scheduleCharts();
    if (!S.follow) return;
    showClock();
    const at = liveClock();
    if (at !== null) showAt(at, 'stream');
  }

  async function connect() {
    if (es) es.close();
    if (stop.closed || TERMINAL.has(S.exp.status)) return;
    const since = Object.entries(S.cursor).map(([sc, n]) => `${sc}:${n}`).join(',');
    es = new EventSource(await linkUrl(id, '/events', { frames: 'true', poll_s: 0.5, since: since || undefined }));
    es.addEventListener('progress', (ev) => { S.exp = JSON.parse(ev.data); renderHead(); setScrubMax(); showClock(); });
    es.addEventListener('frame', (ev) => onFrame(JSON.parse(ev.data)));
    es.addEventListener('done', () => { es.close(); es = null; whenDone(); });
    es.addEventListener('expired', () => { es.close(); forgetToken(id); connect(); });
    es.onerror = () => { es.close(); setTimeout(() => { if (!stop.closed) connect().catch(() => {}); }, 2000); };
  }

  // ------------------------------------------------------------------ a finished experiment
  async function whenDone() {
    S.exp = await api(expPath(id));
    renderHead();
    await loadSeries();
    await renderFinished();
    if (S.follow) replay(Math.max(0, committed() - 1));
  }

  const COLS = ['T_peak_logic', 'T_peak_dram', 'T_avg', 'ips', 'lat_ms', 'lat_p99_ms', 'power_avg_w', 'energy_j',
    'refresh_mhz', 'freq_avg_ghz', 'migrations', 'time_above_thot_ms'];
  async function renderFinished() {
    finished.replaceChildren(el('h2', {}, 'Results'));
    const res = await api(expPath(id, '/results'));
    const base = res.rows.find((r) => r.scenario === 'baseline');
    const delta = (r, c) => { // against baseline, where it differs
      if (!base || r === base || typeof r[c] !== 'number' || r[c] === base[c]) return null;
      return el('span', { class: 'delta' }, ` (${r[c] > base[c] ? '+' : ''}${fmt(r[c] - base[c], 2)})`);
    };
    const cell = (r, c) => el('td', { dataset: { col: c, value: r[c] } }, fmt(r[c], c === 'migrations' ? 0 : 2),
      delta(r, c));
    finished.append(el('table', { class: 'results', id: 'results' },
      el('thead', {}, el('tr', {}, el('th', {}, 'scenario'), COLS.map((c) => el('th', {}, c)))),
      el('tbody', {}, res.rows.map((r) => el('tr', { dataset: { scenario: r.scenario } }, el('th', {}, r.scenario),
        COLS.map((c) => cell(r, c)))))));
    const { files } = await api(expPath(id, '/files'));
    const figures = files.filter((f) => /^plots\/.*\.png$/.test(f.path));
    const figBox = el('div', { class: 'figures' });
    finished.append(el('h2', {}, 'Figures'), figBox);
    for (const f of figures) {
      const img = el('img', { src: await linkUrl(id, `/files/${f.path}`), alt: f.path });
      figBox.append(el('figure', {}, img, el('figcaption', {}, f.path)));
    }
    if (!figures.length) figBox.append(el('p', { class: 'muted' }, 'No figures (plots: false, or not drawn yet).'));
    const download = (sub) => async (ev) => { ev.preventDefault(); location.assign(await linkUrl(id, sub)); };
    const link = (sub, text, attrs = {}) => el('a', { href: '#', onclick: download(sub), ...attrs }, text);
    const item = (f) => el('li', {}, link(`/files/${f.path}`, f.path, { dataset: { path: f.path } }),
      el('span', { class: 'muted small' }, ` ${(f.bytes / 1024).toFixed(1)} kB`));
    finished.append(el('h2', {}, 'Files'),
      el('p', {}, link('/archive', `${id}.zip`, { id: 'archive' }),
        el('span', { class: 'muted small' }, ' the whole folder')),
      el('ul', { class: 'files' }, files.map(item)));
  }

  function renderTrace() {
    const sc = el('select', { id: 'trace-scenario' }, scenarios.map((s) => el('option', { value: s }, s)));
    const start = el('input', { type: 'number', id: 'trace-start', value: 0, min: 0, size: 6 });
    const count = el('input', { type: 'number', id: 'trace-count', value: 10, min: 1, max: 50, size: 4 });
    const out = el('span', { class: 'small', id: 'trace-msg' });
    const go = el('button', { type: 'button', id: 'trace-go' }, 'Download trace');
    go.addEventListener('click', async () => {
      const params = { scenario: sc.value, start: start.value, count: count.value };
      const say = (text, status) => { out.textContent = text; out.dataset.status = status; };
      say('reading…', 'busy');
      try {
        const resp = await fetch(await linkUrl(id, '/trace', params));
        if (!resp.ok) { say((await resp.json()).error.message, 'error'); return; }
        const name = `${id}-${sc.value}-w${start.value}.trace.json`;
        el('a', { href: URL.createObjectURL(await resp.blob()), download: name }).click();
        say(`${name}: open it in https://ui.perfetto.dev (or chrome://tracing)`, 'ok');
      } catch (err) { say(err.message, 'error'); }
    });
    tracePanel.replaceChildren(el('h2', {}, 'Schedule (Chrome trace)'),
      el('p', { class: 'row' }, el('label', {}, 'scenario ', sc), el('label', {}, 'from window ', start),
        el('label', {}, 'windows ', count), go), out);
  }

  // ------------------------------------------------------------------ start
  renderHead();
  renderTrace();
  await loadSeries();
  showClock();
  if (TERMINAL.has(S.exp.status)) {
    await renderFinished();
    await replay(Math.max(0, committed() - 1));
  } else {
    for (const sc of scenarios) if (S.cursor[sc]) drawMap(sc, S.cursor[sc] - 1).catch(() => {});
    await connect();
  }
  return () => { stop.closed = true; if (es) es.close(); };
}
