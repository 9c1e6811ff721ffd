// Versions of the conversation on the page: Edit on the user's messages, Regenerate on an
// answer, the "< 2/3 >" switcher on a message with several versions, and the actions done on
// another version. Each change is one request; the page then draws the conversation the
// server shows (the active branch's path) again and follows the turn it started.

import { request, sessionPath } from './api.js';
import { el } from './transcript.js';

const $ = (id) => document.getElementById(id);
// Set by the app: the open session, how to draw it again, how to report a refusal.
let hooks = { sid: () => null, reopen: async () => {}, fail: () => {} };

export function initVersions(given) { hooks = given; }

function button(text, label, onClick) {
  const b = el('button', 'version-action', text);
  b.type = 'button';
  b.setAttribute('aria-label', label);
  b.addEventListener('click', onClick);
  return b;
}

// The controls of one stored message, drawn again with it.
export function decorate(b, m) {
  if (!b) return;
  b.querySelector('.versions')?.remove();
  const controls = el('span', 'versions');
  if (m.versions) controls.append(...switcher(m));
  if (m.role === 'user') {
    controls.append(button('Edit', 'Edit this message', () => startEdit(b, m)));
  } else if (m.turn_id && m.status === 'complete') {
    controls.append(button('Regenerate', 'Regenerate this answer', () => regenerate(m)));
  }
  b.querySelector('.meta').append(controls);
}

function switcher(m) {
  const { count, shown } = m.versions;
  const position = el('span', 'version-position', shown + '/' + count);
  position.setAttribute('aria-label', 'Version ' + shown + ' of ' + count);
  const previous = button('‹', 'Previous version', () => show(m, shown - 1));
  const next = button('›', 'Next version', () => show(m, shown + 1));
  previous.disabled = shown <= 1;
  next.disabled = shown >= count;
  return [previous, position, next];
}

async function show(m, version) {
  const r = await request('POST', sessionPath(hooks.sid(), 'messages', m.id, 'versions', String(version)));
  if (!r.ok) return hooks.fail(r);
  await hooks.reopen();
}

async function regenerate(m) {
  const r = await request('POST', sessionPath(hooks.sid(), 'turns', m.turn_id, 'regenerate'));
  if (r.status !== 202) return hooks.fail(r);
  await hooks.reopen();
}

// The message's text becomes a form in place; Save sends the new version.
function startEdit(b, m) {
  if (b.querySelector('.edit-form')) return;
  const form = el('form', 'edit-form');
  const box = el('textarea', 'edit-text');
  box.value = m.text;
  box.rows = 3;
  box.setAttribute('aria-label', 'Edit your message');
  const save = el('button', 'version-action', 'Save');
  save.type = 'submit';
  const cancel = button('Cancel', 'Cancel the edit', () => { form.remove(); body.hidden = false; });
  form.append(box, save, cancel);
  const body = b.querySelector('.body');
  body.hidden = true;
  body.after(form);
  box.focus();
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const text = box.value.trim();
    if (!text) return;
    save.disabled = true;
    const edit = { client_message_id: crypto.randomUUID(), text };
    const r = await request('POST', sessionPath(hooks.sid(), 'messages', m.id, 'edit'), edit);
    if (r.status !== 202 && r.status !== 200) { save.disabled = false; return hooks.fail(r); }
    await hooks.reopen();
  });
}

// What happened on another version stays done: said above the conversation.
export function showElsewhere(done) {
  $('transcript').querySelector('.elsewhere')?.remove();
  if (!done || !done.length) return;
  const note = el('div', 'elsewhere');
  note.setAttribute('role', 'note');
  note.append(el('span', 'elsewhere-label', 'Done in another version of this conversation:'));
  const list = el('ul');
  for (const a of done) {
    const said = a.status === 'executed' ? 'sent' : a.status;
    list.append(el('li', null, a.summary + (a.recipient_masked ? ' to ' + a.recipient_masked : '') + ' (' + said + ')'));
  }
  note.append(list);
  $('empty-hint').after(note);
}
