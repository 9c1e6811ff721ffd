// The agent inbox (docs/features/handoff.md): the tenant's open hand-offs, one case at a
// time with its summary, conversation and notes; claim, reply, note, resolve, hand back.
// The selected case's stream keeps its conversation live; the list is read again every few
// seconds and after each action.

import { auth, errorText, request, tryToken } from './api.js';
import { followTurn } from './stream.js';

const $ = (id) => document.getElementById(id);
const LIST_EVERY_MS = 5000;
const S = { selected: null, follow: null, timer: null };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function status(text, kind) {
  $('status').textContent = text || '';
  $('status').dataset.kind = kind || '';
}

function age(iso) {
  const minutes = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 60000));
  return minutes < 1 ? 'just now' : minutes + ' min ago';
}

/* ---------- sign-in ---------- */

async function signIn(event) {
  event.preventDefault();
  const r = await tryToken($('token').value.trim(), '/v1/handoffs', $('signin-error'),
    (r) => (r.status === 403 ? 'This token is not an agent\'s: the inbox needs the role "agent".' : null));
  if (!r.ok) return;
  $('token').value = '';
  show(r.data.handoffs);
}

function show(cases) {
  $('signin').hidden = true;
  $('inbox').hidden = false;
  $('sign-out').hidden = false;
  $('whoami').textContent = 'Signed in as an agent';
  drawCases(cases);
  clearInterval(S.timer);
  S.timer = setInterval(loadCases, LIST_EVERY_MS);
}

function signOut() {
  auth.clear();
  location.reload();
}

/* ---------- the list ---------- */

async function loadCases() {
  const r = await request('GET', '/v1/handoffs');
  if (r.ok) drawCases(r.data.handoffs);
}

// What opened a case, as the list says it (the route lists the highest priority first).
const OPENED_BY = {
  tool: 'the assistant handed it over',
  user_asked: 'the customer asked',
  policy: 'opened by policy',
};

// In the route's order: the highest priority first, then the oldest.
function drawCases(cases) {
  const list = $('cases');
  list.textContent = '';
  $('no-cases').hidden = cases.length > 0;
  for (const c of cases) {
    const button = el('button', 'case-button');
    button.type = 'button';
    button.dataset.handoffId = c.id;
    button.append(el('span', 'case-reason', c.reason));
    const held = c.status === 'claimed' ? 'held by ' + (c.agent_name || 'an agent') : 'waiting';
    const meta = ['priority ' + c.priority, OPENED_BY[c.opened_by], held, age(c.created_at)];
    button.append(el('span', 'case-meta', meta.filter(Boolean).join(' · ')));
    if (S.selected === c.id) button.setAttribute('aria-current', 'true');
    button.addEventListener('click', () => select(c.id));
    const item = el('li');
    item.append(button);
    list.append(item);
  }
}

/* ---------- one case ---------- */

async function select(id) {
  if (S.follow) S.follow.abort();
  S.selected = id;
  await loadCase();
  S.follow = followTurn('/v1/handoffs/' + encodeURIComponent(id) + '/events', {
    event: (type) => { if (type === 'message' || type === 'handoff') loadCase(); return false; },
    connection: () => {},
  });
  loadCases();
}

async function loadCase() {
  if (!S.selected) return;
  const r = await request('GET', '/v1/handoffs/' + encodeURIComponent(S.selected));
  if (!r.ok) return status(errorText(r), 'error');
  drawCase(r.data);
}

function drawCase({ handoff: c, messages, notes }) {
  $('case-heading').textContent = 'Hand-off: ' + c.reason;
  const state = {
    waiting: 'Waiting for an agent' + (c.unclaimed_at ? ' (the customer was told nobody was free)' : ''),
    claimed: 'Held by ' + (c.agent_name || 'an agent'),
    resolved: 'Resolved', handed_back: 'Handed back to the assistant',
  }[c.status] || c.status;
  $('case-state').textContent = state;
  $('summary').textContent = c.summary || 'The summary is being written…';
  const open = c.status === 'waiting' || c.status === 'claimed';
  $('claim').hidden = c.status !== 'waiting';
  $('resolve').hidden = c.status !== 'claimed';
  $('hand-back').hidden = c.status !== 'claimed';
  $('reply-form').hidden = c.status !== 'claimed';
  $('note-form').hidden = !open;
  const conversation = $('conversation');
  conversation.textContent = '';
  for (const m of messages) {
    if ((m.role !== 'user' && m.role !== 'assistant') || !m.text) continue; // a tool request has no words
    const who = m.role === 'user' ? 'Customer' : (m.author_name || 'Assistant');
    const item = el('li', 'from-' + (m.role === 'user' ? 'customer' : m.author_name ? 'agent' : 'assistant'));
    item.append(el('span', 'who', who + ':'), el('span', 'text', m.text));
    conversation.append(item);
  }
  const list = $('notes');
  list.textContent = '';
  for (const n of notes) list.append(el('li', 'note', n.agent_name + ': ' + n.text));
}

async function act(path, body) {
  const r = await request('POST', '/v1/handoffs/' + encodeURIComponent(S.selected) + path, body);
  status(r.ok ? '' : errorText(r), r.ok ? '' : 'error');
  await loadCase();
  loadCases();
  return r.ok;
}

async function submitText(event, field, path) {
  event.preventDefault();
  const text = $(field).value.trim();
  if (!text) return;
  if (await act(path, { text })) $(field).value = '';
}

$('token-form').addEventListener('submit', signIn);
$('sign-out').addEventListener('click', signOut);
$('claim').addEventListener('click', () => act('/claim'));
$('resolve').addEventListener('click', () => act('/resolve'));
$('hand-back').addEventListener('click', () => act('/hand-back'));
$('reply-form').addEventListener('submit', (e) => submitText(e, 'reply', '/messages'));
$('note-form').addEventListener('submit', (e) => submitText(e, 'note', '/notes'));

if (auth.token) {
  request('GET', '/v1/handoffs').then((r) => (r.ok ? show(r.data.handoffs) : auth.clear()));
}
