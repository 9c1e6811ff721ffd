// The chat page: the conversation list, sending, following a turn's stream, the session
// stream, Retry and the options. State lives in `S` (state.js); sign-in is signin.js, cards
// cards.js, Stop stop.js, a turn's events turn_events.js, an opening's retries opening.js;
// the DOM is drawn by transcript.js, confirm.js and sessions.js.

import { auth, errorText, request, sessionPath } from './api.js';
import { initCards, showCard } from './cards.js';
import { removeConfirm } from './confirm.js';
import { followSession } from './live.js';
import { initMemory, loadMemory } from './memory.js';
import { openRead, opened } from './opening.js';
import { renderSessions } from './sessions.js';
import { initSignIn, showSignIn } from './signin.js';
import { initStop } from './stop.js';
import { followCase, stopCase } from './handoff.js';
import { $, RESTING, S, TERMINAL, status } from './state.js';
import { followTurn } from './stream.js';
import * as T from './transcript.js';
import { initTurnEvents, onEvent } from './turn_events.js';
import { decorate, initVersions, showElsewhere } from './versions.js';

const SID_KEY = 'parley_session';

/* ---------- status line ---------- */

// While an answer streams, Enter steers it (the message joins the running answer) and the
// button queues (it waits as the next turn); the hint says which is which.
function setBusy(on) {
  S.busy = on;
  $('send').disabled = on && S.queued !== null;
  $('send').textContent = on ? 'Queue' : 'Send';
  $('steer-hint').hidden = !on;
  $('stop').hidden = !on;
  if (!on) $('stop-queued').hidden = true;
}

function fail(r) {
  if (r.status === 401) return signOut('Your sign-in is no longer valid. Please sign in again.');
  status(errorText(r), 'error');
}

/* ---------- sign-in ---------- */

async function boot() {
  const config = await request('GET', '/web/config');
  if (config.ok) {
    S.demoUsers = config.data.demo_users || [];
    T.view.turnLink = config.data.turn_link_template;
  }
  if (auth.token) enterApp();
  else showSignIn('');
}

function signOut(message) {
  stopFollowing();
  stopLive();
  auth.clear();
  sessionStorage.removeItem(SID_KEY);
  S.sid = null;
  S.openGen += 1; // an opening still under way stops
  T.clear();
  removeConfirm();
  status('');
  showSignIn(message);
}

initVersions({ sid: () => S.sid, reopen: () => openSession(S.sid), fail });
initSignIn(enterApp);
initCards({ follow, openSession, fail });
initTurnEvents({ send, fetchFile });

async function enterApp() {
  $('signin').hidden = true;
  $('app').hidden = false;
  $('sign-out').hidden = false;
  $('menu').hidden = false;
  $('whoami').textContent = auth.name ? 'Signed in as ' + auth.name : 'Signed in';
  const remembered = sessionStorage.getItem(SID_KEY);
  await loadSessions();
  loadMemory(); // the memory panel fills in on its own
  if (remembered && S.sessions.some((s) => s.id === remembered)) await openSession(remembered);
  else newConversation();
}

/* ---------- conversations ---------- */

async function loadSessions() {
  const r = await request('GET', '/v1/sessions');
  if (!r.ok) return fail(r);
  S.sessions = r.data.sessions || [];
  drawSessions();
}

function drawSessions() {
  renderSessions(S.sessions, S.sid, { open: openSession, remove: deleteSession });
}

// Leaves the shown conversation for `sid` (null: a new one) with an empty, idle view; returns
// the generation that tells a late answer for an earlier switch to stand down.
function switchTo(sid) {
  stopFollowing();
  stopCase();
  stopLive();
  S.seen = new Map();
  S.ended = new Set();
  const gen = ++S.openGen;
  Object.assign(S, { sid, lastSeq: 0, turnId: null, options: null, replacing: null, queued: null });
  if (sid) sessionStorage.setItem(SID_KEY, sid);
  else sessionStorage.removeItem(SID_KEY);
  T.clear();
  removeConfirm();
  status('');
  setBusy(false);
  drawSessions();
  closeMenu();
  return gen;
}

function newConversation() {
  switchTo(null);
  $('input').focus();
}

async function openSession(sid) {
  const gen = switchTo(sid);
  // The transcript first: the stream starts at its cursor, so whatever the session's read
  // misses (a message queued, a turn begun after it) comes on the stream.
  const cursor = await syncMessages(0, gen);
  if (gen !== S.openGen || cursor === undefined) return;
  const r = await openRead(sessionPath(sid), gen);
  if (gen !== S.openGen) return;
  if (!r.ok) return fail(r);
  // Stored between the two reads (an answer that ended, the queued message its end started):
  // drawn now, as the session's turn is followed from its own message on.
  if ((r.data.last_seq || 0) > S.lastSeq && (await syncMessages(S.lastSeq, gen)) === undefined) return;
  if (gen !== S.openGen) return;
  opened(gen);
  S.lastSeq = Math.max(S.lastSeq, r.data.last_seq || 0);
  followCase(sid, seen); // a person may hold it
  const active = r.data.active_turn;
  const waiting = r.data.queued_message; // sent while the active turn ran
  if (waiting) S.queued = { turnId: waiting.turn_id, url: sessionPath(sid, 'turns', waiting.turn_id, 'events'), bubble: T.pending(waiting) };
  // A turn still running, or resting on a card: replay its stream from the start.
  if (active) follow(active.id, sessionPath(sid, 'turns', active.id, 'events'), active.user_seq, null);
  else if (!followQueued()) offerRetry();
  // A card asked for again after its turn ended waits on its own.
  if (!active && r.data.pending_action) showCard(r.data.pending_action);
  goLive(cursor);
}

async function deleteSession(sid) {
  S.deleting = sid; // its session stream says so too: not "in another window"
  const r = await request('DELETE', sessionPath(sid));
  if (!r.ok && r.status !== 404) return fail(r);
  S.sessions = S.sessions.filter((s) => s.id !== sid);
  if (S.sid === sid) newConversation();
  else drawSessions();
  status('Conversation deleted.');
}

// Draw the stored messages after `fromSeq` (paged); their status, times and badges are the
// server's, replacing whatever streamed. Returns the session stream's cursor as of the first
// page: what happened since comes on the stream (a later page's messages again, drawn once).
// With `gen`, read as the opening `gen` reads (`openRead`).
async function syncMessages(fromSeq, gen) {
  const sid = S.sid;
  let after = fromSeq;
  let cursor = null;
  for (;;) {
    const path = sessionPath(sid, 'messages') + '?after_seq=' + after + '&limit=200';
    const r = gen === undefined ? await request('GET', path) : await openRead(path, gen);
    if (sid !== S.sid || (gen !== undefined && gen !== S.openGen)) return; // moved on meanwhile
    if (!r.ok) return fail(r);
    const messages = r.data.messages || [];
    if (cursor === null) cursor = r.data.cursor || null;
    const withFiles = new Set();
    showElsewhere(r.data.elsewhere);
    for (const m of messages) {
      decorate(T.showMessage(m), m); // Edit, Regenerate, the version switcher
      // A skill's files, named by its tool message: drawn again under the answer after a reload.
      for (const f of (m.tool && m.tool.files) || []) {
        T.artifact(m.turn_id, f, fetchFile);
        withFiles.add(m.turn_id);
      }
      S.lastSeq = Math.max(S.lastSeq, m.seq);
      after = m.seq;
    }
    withFiles.forEach((turnId) => T.attachArtifacts(turnId));
    if (messages.length < 200) return cursor;
  }
}

/* ---------- sending ---------- */

async function send(text, interactionValue) {
  text = (text || '').trim();
  if (!text || (S.busy && S.queued)) return;
  if (S.busy) return queue(text);
  status('');
  $('send').disabled = true;
  if (!S.sid) {
    const created = await request('POST', '/v1/sessions');
    if (!created.ok) { $('send').disabled = false; return fail(created); }
    S.sid = created.data.id;
    sessionStorage.setItem(SID_KEY, S.sid);
    goLive();
  }
  const body = { client_message_id: crypto.randomUUID(), text, expected_last_seq: S.lastSeq };
  if (interactionValue !== undefined) body.interaction_value = interactionValue;
  S.posting = request('POST', sessionPath(S.sid, 'messages'), body);
  const r = await S.posting;
  S.posting = null;
  $('send').disabled = S.busy;
  if (r.status === 202 || r.status === 200) {
    $('input').value = '';
    $('followups').textContent = '';
    removeConfirm(); // a new message supersedes a waiting card
    document.querySelectorAll('.retry').forEach((b) => b.remove());
    decorate(T.showMessage(r.data.message), r.data.message);
    S.lastSeq = Math.max(S.lastSeq, r.data.message.seq);
    if (!r.data.turn_id) return followCase(S.sid, seen); // a person holds the conversation
    const sameTurn = r.data.turn_id === S.turnId; // an answer to a waiting specialist
    follow(r.data.turn_id, r.data.events_url, r.data.message.seq, sameTurn ? S.seen.get(S.turnId) ?? null : null);
    loadSessions(); // a new conversation gets its title from this message
    return;
  }
  if (r.error && r.error.code === 'stale_view') {
    await syncMessages(S.lastSeq); // another tab moved on: catch up, keep the draft
    status('The conversation changed in another window; it is up to date now. Press Send again.', 'error');
    return;
  }
  fail(r);
}

// Sent while an answer streams: the server queues it as the session's next turn (no
// `expected_last_seq`: its place is after the running answer, whatever that stores).
async function queue(text) {
  $('send').disabled = true;
  const body = { client_message_id: crypto.randomUUID(), text };
  S.queueing = request('POST', sessionPath(S.sid, 'messages'), body);
  const r = await S.queueing;
  S.queueing = null;
  if ((r.status === 202 || r.status === 200) && r.data.state === 'queued' && S.busy) {
    $('input').value = '';
    S.queued = { turnId: r.data.turn_id, url: r.data.events_url, bubble: T.pending(r.data.message) };
    setBusy(true);
    return;
  }
  $('send').disabled = S.busy && S.queued !== null;
  if (r.status === 202 || r.status === 200) return follow(r.data.turn_id, r.data.events_url, S.lastSeq, null);
  fail(r);
}

// Enter while an answer streams: the message steers it (taken at the answer's next safe
// point, announced by `steered`). If the answer ended meanwhile, it is a new turn.
async function steer(text) {
  text = (text || '').trim();
  if (!text) return;
  const body = { client_message_id: crypto.randomUUID(), text, mode: 'steer' };
  S.posting = request('POST', sessionPath(S.sid, 'messages'), body);
  const r = await S.posting;
  S.posting = null;
  if (!(r.status === 202 || r.status === 200)) return fail(r);
  $('input').value = '';
  T.showMessage(r.data.message);
  S.lastSeq = Math.max(S.lastSeq, r.data.message.seq);
  if (!r.data.steered && r.data.turn_id !== S.turnId) {
    follow(r.data.turn_id, r.data.events_url, r.data.message.seq, null);
  }
}

// The running turn ended: its queued message is now the conversation's next turn.
function followQueued() {
  const q = S.queued;
  S.queued = null;
  if (!q) return false;
  q.bubble.remove();
  follow(q.turnId, q.url, S.lastSeq, null);
  syncMessages(S.lastSeq); // the message joined the conversation when the first turn ended
  return true;
}

/* ---------- following a turn ---------- */

// A message the page drew outside a turn's stream (a person's reply): the next post's view.
function seen(m) {
  S.lastSeq = Math.max(S.lastSeq, m.seq);
}

function stopFollowing() {
  if (S.follow) S.follow.abort();
  S.follow = null;
  S.streaming = null;
}

function follow(turnId, url, fromSeq, after) {
  stopFollowing();
  S.turnId = turnId;
  S.turnFromSeq = fromSeq;
  // Answered elsewhere, or its answer came on the session stream before this tab's own
  // request did: there is nothing left to read (a stream resumed past the end would be
  // opened again and again).
  if (S.ended.has(turnId)) return;
  S.streaming = turnId;
  setBusy(true);
  const gen = S.openGen;
  const current = followTurn(url, {
    event: (type, data, fromScratch, id) => draw(turnId, id, type, data, fromScratch),
    connection: (state, outcome, detail) => {
      if (current !== S.follow) return;
      if (state === 'reconnecting') status('Connection lost. Reconnecting…', 'warning');
      else if (state === 'live' && $('status').dataset.kind === 'warning') status('');
      else if (state === 'closed') { S.streaming = null; afterTurn(outcome, detail, gen); }
    },
  }, after);
  S.follow = current;
}

// A turn's events are drawn here, whichever stream brings one first (this tab's own turn
// stream, or the session stream): an event drawn already is not drawn again. True for a
// terminal event.
function draw(turnId, id, type, d, fromScratch) {
  if (id <= (S.seen.get(turnId) || 0)) return TERMINAL.has(type);
  S.seen.set(turnId, id);
  if (TERMINAL.has(type)) S.ended.add(turnId);
  return onEvent(turnId, type, d, fromScratch);
}

/* ---------- the session stream: other tabs and devices, live ---------- */

// `cursor`: the transcript's, so that nothing done between its read and the stream is missed.
function goLive(cursor) {
  if (!S.sid || S.live) return;
  const sid = S.sid;
  S.live = followSession(sid, (type, d) => { if (sid === S.sid) onLive(type, d); }, cursor);
}

function stopLive() {
  if (S.live) S.live.abort();
  S.live = null;
}

function onLive(type, d) {
  if (type === 'ready') return liveReady(d.turns);
  if (type === 'message') return liveMessage(d.message);
  if (type === 'turn') return liveTurn(d.turn_id);
  if (type === 'branch_switched') return openSession(S.sid); // another version, as versions.js
  if (type === 'handoff') return followCase(S.sid, seen); // a person's team holds it (handoff.js)
  if (type === 'session_deleted') {
    if (S.deleting === S.sid) return;
    S.sessions = S.sessions.filter((s) => s.id !== S.sid);
    newConversation();
    status('This conversation was deleted in another window.');
    return;
  }
  if (d.turn_id !== S.turnId || d.id <= (S.seen.get(d.turn_id) || 0)) return;
  // Without a stream of its own for this turn, the tab follows it here: started in
  // another tab, or going on after a card answered there.
  const own = S.streaming === d.turn_id;
  if (!own && !S.busy && !TERMINAL.has(type) && !RESTING.has(type)) setBusy(true);
  const terminal = draw(d.turn_id, d.id, type, d.data, false);
  if (own) return; // its own stream ends the turn in this tab
  if (terminal) afterTurn('terminal', null, S.openGen);
  else if (RESTING.has(type)) afterTurn('paused', null, S.openGen);
}

// The turns the stream follows: one this tab neither follows nor holds as queued (begun
// after the transcript's read, or running then and ended before the session's) is shown
// from here.
async function liveReady(turns) {
  if (S.posting) await S.posting;
  const waiting = S.queued && S.queued.turnId;
  const open = (turns || []).find((t) => t !== waiting && !S.ended.has(t));
  if (open && open !== S.turnId) adopt(open, S.lastSeq);
}

// A user's message from another tab or device (one of this tab's own is drawn from its POST's
// answer, which the stream may beat).
async function liveMessage(m) {
  const sid = S.sid;
  if (S.posting) await S.posting;
  if (S.queueing) await S.queueing;
  if (sid !== S.sid || T.bubble(m.id) || T.bubble('pending:' + m.id)) return;
  if (m.seq === 0) { // it waits behind the running answer
    if (!S.queued) S.queued = { turnId: m.turn_id, url: sessionPath(S.sid, 'turns', m.turn_id, 'events'), bubble: T.pending(m) };
    setBusy(S.busy);
    return;
  }
  T.showMessage(m);
  S.lastSeq = Math.max(S.lastSeq, m.seq);
  if (m.turn_id && m.turn_id !== S.turnId) adopt(m.turn_id, m.seq); // none: a hand-off's
}

// A turn started without a new message (a retry): this tab's own is followed from its POST.
async function liveTurn(turnId) {
  if (S.posting) await S.posting;
  if (turnId !== S.turnId) adopt(turnId, S.lastSeq);
}

// A turn started elsewhere: this tab shows it streaming, from the session stream.
function adopt(turnId, fromSeq) {
  if (S.streaming) return; // this tab reads a turn of its own; what it misses, its end syncs
  S.turnId = turnId;
  S.turnFromSeq = fromSeq;
  $('followups').textContent = '';
  document.querySelectorAll('.retry').forEach((b) => b.remove());
  removeConfirm();
  setBusy(true);
}

async function afterTurn(outcome, detail, gen) {
  setBusy(false);
  T.endStreaming();
  if (outcome === 'fatal' && detail) fail(detail);
  if (S.options) { T.attachOptions(S.options); S.options = null; }
  await syncMessages(S.turnFromSeq);
  if (gen !== S.openGen) return;
  if (S.turnId) T.attachArtifacts(S.turnId); // files of a turn that ended without a `done`
  if (outcome !== 'paused' && followQueued()) return;
  if (outcome !== 'paused') offerRetry();
  loadSessions();
  loadMemory(); // a turn may have remembered something
  followCase(S.sid, seen); // the turn may have handed the conversation to a person
}

/* ---------- controls ---------- */

// Retry belongs on the latest answer when it was cut short (incomplete or stopped).
function offerRetry() {
  document.querySelectorAll('.retry').forEach((b) => b.remove());
  const answers = [...document.querySelectorAll('#transcript .msg-assistant[data-seq]')];
  const last = answers.sort((a, b) => Number(a.dataset.seq) - Number(b.dataset.seq)).pop();
  if (!last || !['incomplete', 'cancelled'].includes(last.dataset.status) || !last.dataset.turnId) return;
  const button = T.el('button', 'retry', 'Retry');
  button.type = 'button';
  button.setAttribute('aria-label', 'Retry this answer');
  button.addEventListener('click', () => retry(last, button));
  last.querySelector('.meta').append(button);
}

async function retry(answer, button) {
  button.disabled = true;
  S.posting = request('POST', sessionPath(S.sid, 'turns', answer.dataset.turnId, 'retry'));
  const r = await S.posting;
  S.posting = null;
  if (r.status !== 202) { button.disabled = false; return fail(r); }
  button.remove();
  status('');
  S.replacing = answer; // the new answer takes this one's place
  follow(r.data.turn_id, r.data.events_url, r.data.message.seq, null);
}

// A file of the session (owner only, so with the token), as a Blob; null when it cannot be had.
async function fetchFile(fileId) {
  const res = await fetch(sessionPath(S.sid, 'files', fileId), {
    headers: { Authorization: 'Bearer ' + auth.token },
  }).catch(() => null);
  return res && res.ok ? res.blob().catch(() => null) : null;
}

/* ---------- narrow screens: the list is a panel behind a button ---------- */

function closeMenu() {
  document.body.classList.remove('menu-open');
  $('menu').setAttribute('aria-expanded', 'false');
}

$('menu').addEventListener('click', () => {
  const open = document.body.classList.toggle('menu-open');
  $('menu').setAttribute('aria-expanded', String(open));
});

/* ---------- wiring ---------- */

$('sign-out').addEventListener('click', () => signOut(''));
$('new-session').addEventListener('click', newConversation);
initMemory();
initStop(fail);
$('composer').addEventListener('submit', (e) => { e.preventDefault(); send($('input').value); });
$('input').addEventListener('keydown', (e) => {
  // Enter sends (steers, while an answer streams); Shift+Enter is a new line; Enter that
  // ends an IME composition is not a send.
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    if (S.busy && S.sid) steer($('input').value);
    else send($('input').value);
  }
});
setInterval(drawSessions, 30000); // keep "5 min ago" true

boot();
