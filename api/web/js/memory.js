// The memory panel: the user's consent to durable memory and what is remembered with it
// (GET /v1/memory, PUT /v1/memory/consent, DELETE /v1/memory/{key}). Off by default;
// turning it off deletes everything remembered.

import { errorText, request } from './api.js';
import { el } from './transcript.js';

const $ = (id) => document.getElementById(id);
const LABELS = { contact_channel: 'How to contact you' };
const label = (key) => LABELS[key] || key.replaceAll('_', ' ');

function say(text) {
  $('memory-status').textContent = text || '';
}

function draw(data) {
  $('memory-consent').checked = Boolean(data.consent);
  const list = $('memory-items');
  list.textContent = '';
  if (!data.consent) {
    list.append(el('li', 'memory-empty', 'Nothing is remembered between conversations.'));
    return;
  }
  if (!data.items.length) list.append(el('li', 'memory-empty', 'Nothing remembered yet.'));
  for (const item of data.items) {
    const li = el('li', 'memory-item');
    li.dataset.key = item.key;
    const text = el('span', 'memory-text');
    text.append(el('span', 'memory-key', label(item.key) + ': '), el('span', 'memory-value', item.value));
    const remove = el('button', 'memory-delete', 'Forget');
    remove.type = 'button';
    remove.setAttribute('aria-label', 'Forget: ' + label(item.key));
    remove.addEventListener('click', () => forget(item.key));
    li.append(text, remove);
    list.append(li);
  }
}

export async function loadMemory() {
  const r = await request('GET', '/v1/memory');
  if (!r.ok) return say(errorText(r));
  say('');
  draw(r.data);
}

async function setConsent(consent) {
  const r = await request('PUT', '/v1/memory/consent', { consent });
  if (!r.ok) {
    $('memory-consent').checked = !consent;
    return say(errorText(r));
  }
  draw(r.data);
  say(consent ? 'Your preferences will be remembered.' : 'Everything remembered was deleted.');
}

async function forget(key) {
  const r = await request('DELETE', '/v1/memory/' + encodeURIComponent(key));
  if (!r.ok && r.status !== 404) return say(errorText(r));
  await loadMemory();
  say('Forgotten: ' + label(key) + '.');
}

export function initMemory() {
  $('memory-consent').addEventListener('change', (e) => setConsent(e.target.checked));
}
