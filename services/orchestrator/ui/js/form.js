// A new experiment, from a form built from the API's own schemas (the OpenAPI description of POST /v1/experiments):
// the request's fields, and for the chip (arch), the workload and the TAS parameters a preset (a shipped config
// file, sent by its name) that can be customised field by field (then sent inline). The form checks nothing itself
// (novalidate): the API validates, and its message is shown at the field it names.
import { API, ApiError, api, openapiUrl } from './api.js';
import { el, notice } from './dom.js';

let schemas = null;

const resolve = (s) => {
  let out = s || {};
  while (out.$ref) out = schemas[out.$ref.split('/').pop()] || {};
  return out;
};

// {schema, nullable, union}: a nullable `anyOf [X, null]` unwrapped to X
function unwrap(raw) {
  const s = resolve(raw);
  if (!s.anyOf) return { schema: s, nullable: false, union: false };
  const opts = s.anyOf.filter((o) => o.type !== 'null');
  const nullable = opts.length < s.anyOf.length;
  if (opts.length === 1) return { schema: { ...resolve(opts[0]), description: s.description }, nullable, union: false };
  return { schema: s, nullable, union: true };
}

const label = (key) => key; // the config's own key, as its YAML spells it
const help = (schema) => (schema.description ? el('span', { class: 'help', title: schema.description }, '?') : null);

// one input for `schema` at `path`, its current `value`; registers how to read it back
function field(key, raw, value, path, inputs) {
  const { schema, nullable, union } = unwrap(raw);
  const props = schema.properties;
  if (!union && schema.type === 'object' && props) {
    const box = el('fieldset', { dataset: { path } }, el('legend', {}, label(key, schema), help(schema)));
    for (const [k, sub] of Object.entries(props)) {
      box.append(field(k, sub, value ? value[k] : undefined, `${path}.${k}`, inputs));
    }
    return box;
  }
  const err = el('span', { class: 'field-error', dataset: { for: path } });
  let input;
  let read;
  if (!union && schema.type === 'boolean') {
    input = el('input', { type: 'checkbox', checked: Boolean(value) });
    read = () => input.checked;
  } else if (!union && schema.enum) {
    const options = (nullable ? [''] : []).concat(schema.enum);
    input = el('select', {}, options.map((v) => el('option', { value: v, selected: v === value }, v)));
    read = () => (input.value === '' && nullable ? null : input.value);
  } else if (!union && (schema.type === 'number' || schema.type === 'integer')) {
    input = el('input', { type: 'number', step: 'any', value: value ?? '', placeholder: nullable ? 'none' : '' });
    read = () => {
      const t = input.value.trim();
      if (t === '') return nullable ? null : undefined;
      return Number.isFinite(Number(t)) ? Number(t) : t; // not a number: sent as typed, for the API to name
    };
  } else if (!union && schema.type === 'string') {
    input = el('input', { type: 'text', value: value ?? '', placeholder: nullable ? 'none' : '' });
    read = () => (input.value === '' && nullable ? null : input.value);
  } else { // arrays, unions, maps: JSON as typed
    const text = value === undefined ? '' : JSON.stringify(value);
    input = text.length > 60 ? el('textarea', { rows: 3 }, text) : el('input', { type: 'text', value: text });
    read = () => {
      const t = input.value.trim();
      if (t === '') return nullable ? null : undefined;
      try { return JSON.parse(t); } catch { return t; }
    };
  }
  input.dataset.path = path;
  input.name = path;
  inputs.push({ path, read, input });
  return el('label', { class: 'field' }, el('span', {}, label(key, schema), help(schema)), input, err);
}

function setPath(obj, parts, v) {
  let cur = obj;
  for (const p of parts.slice(0, -1)) {
    if (cur[p] === null || typeof cur[p] !== 'object') cur[p] = {};
    cur = cur[p];
  }
  if (v === undefined) return;
  cur[parts[parts.length - 1]] = v;
}

// a config section: a preset select (the shipped files of that kind) and its fields, rendered from the preset's
// content when customised; `value()` is the file name, or the edited config inline
function section(kind, schemaName, names, initial, extra) {
  const inputs = [];
  let preset = null;
  let dirty = false;
  const fields = el('div', { class: 'fields' });
  const select = el('select', { name: kind, dataset: { path: kind } },
    names.map((n) => el('option', { value: n, selected: n === initial }, n)));
  const details = el('details', { class: 'custom' }, el('summary', {}, 'customise'), fields);
  const state = el('span', { class: 'muted small' }, 'sent by its file name');
  const box = el('fieldset', { class: 'section', dataset: { section: kind } },
    el('legend', {}, { arch: 'Chip (arch)', workload: 'Workload', tas: 'TAS parameters' }[kind]),
    el('label', { class: 'field' }, el('span', {}, 'preset'), select,
      el('span', { class: 'field-error', dataset: { for: kind } })),
    extra ? extra.node : null, state, details);
  async function load() {
    preset = (await api(`configs/${encodeURIComponent(select.value)}`)).config;
    inputs.length = 0;
    dirty = false;
    state.textContent = 'sent by its file name';
    const props = resolve({ $ref: `#/components/schemas/${schemaName}` }).properties;
    fields.replaceChildren(...Object.entries(props).filter(([k]) => !(extra && extra.skip === k))
      .map(([k, sub]) => field(k, sub, preset[k], `${kind}.${k}`, inputs)));
    if (extra) extra.reset(preset);
  }
  const touched = () => { dirty = true; state.textContent = 'customised: sent inline'; };
  box.addEventListener('input', (ev) => { if (ev.target !== select) touched(); });
  select.addEventListener('change', () => load().catch((e) => notice(e.message)));
  return {
    node: box, load, inputs,
    value() {
      if (!dirty || !preset) return select.value;
      const cfg = structuredClone(preset);
      for (const { path, read } of inputs) setPath(cfg, path.split('.').slice(1), read());
      if (extra) extra.apply(cfg);
      return cfg;
    },
  };
}

// the workload's model: a zoo (or registered) model by name, or a pasted HuggingFace config.json
function modelChooser(models) {
  const zoo = el('select', { name: 'workload.model', dataset: { path: 'workload.model' } },
    models.map((m) => el('option', { value: m }, m)));
  const pasted = el('textarea', { rows: 4, placeholder: 'paste a config.json here', name: 'workload.model.config',
    dataset: { path: 'workload.model.config' } });
  const useZoo = el('input', { type: 'radio', name: 'model-kind', value: 'zoo', checked: true });
  const usePaste = el('input', { type: 'radio', name: 'model-kind', value: 'config' });
  const node = el('div', { class: 'model' },
    el('label', {}, useZoo, ' zoo model ', zoo),
    el('label', {}, usePaste, ' config.json ', pasted),
    el('span', { class: 'field-error', dataset: { for: 'workload.model' } }));
  return {
    node, skip: 'model',
    reset(preset) {
      const m = preset.model;
      if (typeof m === 'string') {
        if (![...zoo.options].some((o) => o.value === m)) zoo.append(el('option', { value: m }, m));
        zoo.value = m; useZoo.checked = true; pasted.value = '';
      } else {
        usePaste.checked = true; pasted.value = JSON.stringify(m.config, null, 1);
      }
    },
    apply(cfg) {
      if (useZoo.checked) { cfg.model = zoo.value; return; }
      let parsed = pasted.value;
      try { parsed = JSON.parse(pasted.value); } catch { /* sent as typed: the API names the field */ }
      cfg.model = { config: parsed };
    },
  };
}

// the inputs whose path best matches the API's field (union tags in its path, e.g. "tas.TasParams.…", skipped)
function inputFor(field, all) {
  const segs = field.split('.');
  let path = segs[0];
  for (const seg of segs.slice(1)) {
    const next = `${path}.${seg}`;
    if (all.some((i) => i.dataset.path === next || i.dataset.path.startsWith(`${next}.`))) path = next;
  }
  const exact = all.filter((i) => i.dataset.path === path);
  return exact[0] || all.find((i) => i.dataset.path.startsWith(`${path}.`)) || null;
}

export async function showForm(main) {
  if (!schemas) schemas = (await (await fetch(openapiUrl())).json()).components.schemas;
  const { configs, models, models_error: modelsError } = await api('configs');
  const req = schemas.ExperimentRequest.properties;
  const top = [];
  const scenarioBoxes = req.scenarios.items.enum.map((s) => el('label', { class: 'check' },
    el('input', { type: 'checkbox', name: 'scenarios', value: s, checked: true, dataset: { path: 'scenarios' } }),
    ` ${s}`));
  const experimentBox = el('fieldset', { class: 'section' }, el('legend', {}, 'Experiment'),
    field('name', req.name, 'from the dashboard', 'name', top),
    el('div', { class: 'field' }, el('span', {}, 'scenarios', help(req.scenarios)), el('span', {}, scenarioBoxes),
      el('span', { class: 'field-error', dataset: { for: 'scenarios' } })),
    field('windows', req.windows, undefined, 'windows', top),
    field('seed', req.seed, undefined, 'seed', top),
    field('events', req.events, false, 'events', top),
    field('traces', req.traces, true, 'traces', top),
    field('plots', req.plots, true, 'plots', top));
  const chooser = modelChooser(models);
  const arch = section('arch', 'ArchConfig', configs.arch, req.arch.default, null);
  const workload = section('workload', 'WorkloadConfig', configs.workload, req.workload.default, chooser);
  const tas = section('tas', 'TasParams', configs.tas, req.tas.default, null);
  const error = el('div', { id: 'form-error', class: 'form-error', role: 'alert', hidden: true });
  const submit = el('button', { type: 'submit', class: 'primary' }, 'Submit');
  const form = el('form', { id: 'new-experiment', novalidate: true }, experimentBox, arch.node, workload.node, tas.node,
    error, el('div', { class: 'row' }, submit,
      el('span', { class: 'muted small' }, `POST ${new URL('experiments', API).pathname}`)));
  main.append(el('h1', {}, 'New experiment'));
  if (modelsError) main.append(el('p', { class: 'muted' }, `(the workload service did not answer: ${modelsError})`));
  main.append(form);
  await Promise.all([arch.load(), workload.load(), tas.load()]);

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    for (const bad of form.querySelectorAll('.invalid')) bad.classList.remove('invalid');
    for (const msg of form.querySelectorAll('.field-error')) msg.textContent = '';
    error.hidden = true;
    const body = { scenarios: scenarioBoxes.map((l) => l.firstChild).filter((c) => c.checked).map((c) => c.value),
      arch: arch.value(), workload: workload.value(), tas: tas.value() };
    for (const { path, read } of top) {
      const v = read();
      if (v !== undefined && v !== null && v !== '') body[path] = v;
    }
    submit.disabled = true;
    try {
      const got = await api('experiments', { method: 'POST', body });
      location.hash = `#/exp/${got.id}`;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      error.textContent = err.message;
      error.dataset.field = err.field || '';
      error.hidden = false;
      const target = err.field ? inputFor(err.field, [...form.querySelectorAll('[data-path]')]) : null;
      if (target) {
        target.classList.add('invalid');
        for (let d = target.closest('details'); d; d = d.parentElement.closest('details')) d.open = true;
        const slot = form.querySelector(`.field-error[data-for="${CSS.escape(target.dataset.path)}"]`);
        if (slot) slot.textContent = err.message;
        target.scrollIntoView({ block: 'center' });
        target.focus();
      }
    } finally {
      submit.disabled = false;
    }
  });
  return null;
}
