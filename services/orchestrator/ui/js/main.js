// The dashboard's entry: the key field and a hash router (#/ experiments, #/new the form, #/exp/<id> one experiment).
import { getKey, setKey } from './api.js';
import { showList } from './list.js';
import { showForm } from './form.js';
import { showRun } from './run.js';
import { notice } from './dom.js';

const main = document.getElementById('main');
let leave = null; // what the current view stops (timers, streams) when another one is shown

async function route() {
  if (leave) { leave(); leave = null; }
  notice('');
  main.replaceChildren();
  const hash = location.hash || '#/';
  const m = hash.match(/^#\/exp\/([A-Za-z0-9_.-]+)/);
  try {
    if (m) leave = await showRun(main, m[1]);
    else if (hash.startsWith('#/new')) leave = await showForm(main);
    else leave = await showList(main);
  } catch (err) {
    notice(err.status === 401 ? `${err.message} — type your API key above.` : err.message);
  }
}

const keyInput = document.getElementById('key');
keyInput.value = getKey();
document.getElementById('key-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  setKey(keyInput.value.trim());
  route();
});
document.getElementById('key-clear').addEventListener('click', () => {
  keyInput.value = '';
  setKey('');
  route();
});
window.addEventListener('hashchange', route);
route();
