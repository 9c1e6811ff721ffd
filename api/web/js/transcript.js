// The conversation on screen: message bubbles (keyed by message id, ordered by seq), the
// cards a turn shows (confirmation, clarification options, tool progress, citations, the files
// a skill made), and times. Text always enters through textContent or the Markdown renderer.

import { renderMarkdown } from './markdown.js';

const $ = (id) => document.getElementById(id);
const texts = new Map(); // message id -> raw text shown so far (Markdown source)
// Statuses worth a badge: the stored message is not the whole answer.
const BADGES = { incomplete: 'Incomplete', cancelled: 'Stopped', retracted: 'Withdrawn' };
const timeFormat = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit' });
const dayFormat = new Intl.DateTimeFormat(undefined, { day: 'numeric', month: 'short' });

export const view = { turnLink: null }; // `{turn_id}` template from /web/config

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function transcript() { return $('transcript'); }

function scrollDown() {
  const t = transcript();
  t.scrollTop = t.scrollHeight;
}

export function append(node) {
  $('empty-hint').hidden = true;
  // A message waiting for the running answer stays last, under it.
  const waiting = transcript().querySelector('.msg.pending');
  if (waiting && node !== waiting) transcript().insertBefore(node, waiting);
  else transcript().appendChild(node);
  scrollDown();
  return node;
}

export function clear() {
  texts.clear();
  objectUrls.forEach((url) => URL.revokeObjectURL(url));
  objectUrls.clear();
  const t = transcript();
  [...t.children].forEach((c) => { if (c.id !== 'empty-hint') c.remove(); });
  $('empty-hint').hidden = false;
  $('followups').textContent = '';
}

export function bubble(messageId) {
  return [...transcript().querySelectorAll('.msg')].find((b) => b.dataset.messageId === messageId);
}

function timeElement(iso) {
  const t = el('time', 'msg-time');
  const when = iso ? new Date(iso) : new Date();
  t.dateTime = when.toISOString();
  t.textContent = timeFormat.format(when);
  return t;
}

function makeBubble(role, messageId, turnId) {
  const b = el('article', 'msg msg-' + role);
  b.dataset.messageId = messageId;
  if (turnId) b.dataset.turnId = turnId;
  b.setAttribute('aria-label', role === 'user' ? 'You said' : 'Assistant replied');
  b.append(el('div', 'body'), el('div', 'meta'), el('div', 'extras'));
  return b;
}

function place(b, seq) {
  // Before the first bubble with a later seq; otherwise at the end.
  const later = [...transcript().querySelectorAll('.msg[data-seq]')]
    .find((o) => Number(o.dataset.seq) > seq);
  if (later) {
    $('empty-hint').hidden = true;
    transcript().insertBefore(b, later);
  } else append(b);
}

function setText(b, role, text) {
  texts.set(b.dataset.messageId, text);
  const body = b.querySelector('.body');
  if (role === 'user') body.textContent = text;
  else renderMarkdown(body, text);
}

function drawMeta(b, m) {
  const meta = b.querySelector('.meta');
  meta.textContent = '';
  if (m.author_name) meta.append(el('span', 'author', m.author_name)); // a person's reply
  meta.append(timeElement(m.created_at));
  const badge = BADGES[m.status];
  if (badge) meta.append(el('span', 'badge badge-' + m.status, badge));
  if (m.role === 'assistant' && view.turnLink && m.turn_id) {
    const a = el('a', 'turn-link', 'turn');
    a.href = view.turnLink.replace('{turn_id}', encodeURIComponent(m.turn_id));
    a.target = '_blank';
    a.rel = 'noopener noreferrer';
    a.title = 'This answer\'s workflow in the Temporal UI';
    a.setAttribute('aria-label', 'Turn ' + m.turn_id + ' in the Temporal UI');
    meta.append(a);
  }
}

// Insert or update a bubble from a stored Message: its text, time and badge are the server's.
export function showMessage(m) {
  if (m.role !== 'user' && m.role !== 'assistant') return null;
  let b = bubble(m.id);
  // A step that only asked for tools has nothing to read.
  if (!b && m.role === 'assistant' && !m.text && m.tool_calls && m.tool_calls.length) return null;
  if (!b) {
    b = makeBubble(m.role, m.id, m.turn_id);
    place(b, m.seq);
  }
  b.classList.remove('streaming');
  b.removeAttribute('aria-busy');
  b.dataset.seq = m.seq;
  b.dataset.status = m.status;
  if (m.turn_id) b.dataset.turnId = m.turn_id;
  setText(b, m.role, m.text || '');
  drawMeta(b, m);
  return b;
}

// A message sent while an answer streams: shown last, under that answer, as waiting.
// Keyed apart from the message: once stored, the message is drawn in its place and this goes.
export function pending(m) {
  const b = makeBubble('user', 'pending:' + m.id, m.turn_id);
  b.classList.add('pending');
  setText(b, 'user', m.text);
  b.querySelector('.meta').append(el('span', 'badge badge-pending', 'Sends when this answer ends'));
  return append(b);
}

// Streamed text for a message that is not stored yet (or is being replayed from scratch).
export function appendDelta(messageId, text, turnId, restart, replacing) {
  let b = bubble(messageId);
  if (!b) {
    b = makeBubble('assistant', messageId, turnId);
    if (replacing && replacing.isConnected) replacing.replaceWith(b);
    else append(b);
    b.querySelector('.meta').append(timeElement(null));
  }
  if (!b.classList.contains('streaming')) {
    b.classList.add('streaming');
    b.setAttribute('aria-busy', 'true'); // read out once, when the answer is whole
    b.querySelector('.meta .badge')?.remove();
    if (restart) texts.set(messageId, '');
  }
  setText(b, 'assistant', (texts.get(messageId) || '') + text);
  scrollDown();
  return b;
}

// An answer a steer stopped (a `steered` event): kept in view, marked, never the answer.
export function supersede(messageId) {
  const b = bubble(messageId);
  if (!b) return;
  b.classList.remove('streaming');
  b.classList.add('superseded');
  b.removeAttribute('aria-busy');
  b.setAttribute('aria-label', 'Assistant started, then took your new message into account');
  b.querySelector('.meta').append(el('span', 'badge badge-superseded', 'Superseded by your message'));
}

export function resetMessage(messageId) {
  const b = bubble(messageId);
  if (b) setText(b, 'assistant', '');
}

export function retract(messageId, replacement) {
  const b = bubble(messageId);
  if (!b) return;
  b.classList.remove('streaming');
  b.removeAttribute('aria-busy');
  setText(b, 'assistant', replacement);
}

export function endStreaming() {
  transcript().querySelectorAll('.msg.streaming').forEach((b) => {
    b.classList.remove('streaming');
    b.removeAttribute('aria-busy');
  });
}

/* ---------- tool progress ---------- */

function activity(turnId) {
  let box = [...transcript().querySelectorAll('.turn-activity')].find((x) => x.dataset.turnId === turnId);
  if (!box) {
    box = el('div', 'turn-activity');
    box.dataset.turnId = turnId;
    append(box);
  }
  return box;
}

export function toolChip(turnId, d) {
  const box = activity(turnId);
  let chip = [...box.querySelectorAll('.tool-chip')].find((c) => c.dataset.callId === d.call_id);
  if (!chip) {
    chip = el('span', 'tool-chip');
    chip.dataset.callId = d.call_id;
    box.append(chip);
  }
  chip.dataset.phase = d.phase;
  const label = (d.label || d.name).replace(/…$/, '');
  if (d.phase === 'start') {
    chip.textContent = label;
    chip.prepend(el('span', 'spinner'));
    chip.setAttribute('aria-label', label + ': running');
  } else {
    const failed = d.status && d.status !== 'ok';
    chip.textContent = (failed ? '⚠ ' : '✓ ') + label;
    chip.classList.toggle('failed', Boolean(failed));
    chip.setAttribute('aria-label', label + ': ' + (d.status || 'done'));
  }
}

export function notice(text, kind) {
  return append(el('p', 'notice' + (kind ? ' notice-' + kind : ''), text));
}

/* ---------- clarification: the options under the question, the question once ---------- */

// The question streams as the answer's text; the options join that bubble. When no bubble of
// the turn carries the question, the card shows it itself.
export function options(turnId, d, choose) {
  const group = el('div', 'options');
  group.setAttribute('role', 'group');
  group.setAttribute('aria-label', d.question || 'Choose an option');
  group.dataset.turnId = turnId;
  group.dataset.question = d.question || '';
  for (const o of d.options || []) {
    const button = el('button', 'option', o.label);
    button.type = 'button';
    button.dataset.value = o.value;
    button.addEventListener('click', () => {
      group.querySelectorAll('button').forEach((x) => { x.disabled = true; });
      choose(o);
    });
    group.append(button);
  }
  return group;
}

export function attachOptions(group) {
  const turnId = group.dataset.turnId;
  const answer = [...transcript().querySelectorAll('.msg-assistant')]
    .filter((b) => b.dataset.turnId === turnId).pop();
  if (answer) {
    answer.querySelector('.extras').append(group);
    return;
  }
  const card = el('div', 'card clarification');
  card.append(el('p', 'question', group.dataset.question), group);
  append(card);
}

/* ---------- citations and files under an answer ---------- */

export function citations(d) {
  const b = bubble(d.message_id);
  if (!b || !d.sources || !d.sources.length) return;
  const extras = b.querySelector('.extras');
  extras.querySelector('.citations')?.remove();
  const box = el('div', 'citations');
  box.append(el('span', 'citations-label', 'Sources'));
  const list = el('ul');
  for (const s of d.sources) {
    const parts = [s.doc, s.section && '§ ' + s.section, s.version && 'v' + s.version].filter(Boolean);
    list.append(el('li', 'citation', parts.join(' · ')));
  }
  box.append(list);
  extras.append(box);
}

/* ---------- files a skill made: shown under the answer of their turn ---------- */

const objectUrls = new Set(); // blob: URLs of fetched files, revoked when the view is cleared

// "spending_by_week.png" -> "Spending by week", the start of an image's text alternative.
function nameWords(name) {
  const words = name.replace(/\.[a-z0-9]+$/i, '').replace(/[_-]+/g, ' ').trim() || name;
  return words.charAt(0).toUpperCase() + words.slice(1);
}

// A file the turn produced: an image inline, every file with a download link beside it. The
// files route wants the bearer token, so the bytes are fetched (`fetchFile(file_id)` -> Blob
// or null) and shown from a blob: URL, which the page's Content-Security-Policy allows for
// images. It waits with the turn's tool progress until the answer it belongs under is there
// (`attachArtifacts`). A replayed event draws nothing twice.
export async function artifact(turnId, d, fetchFile) {
  const shown = [...transcript().querySelectorAll('.artifact')].some((f) => f.dataset.fileId === d.file_id);
  if (shown) return;
  const figure = el('figure', 'artifact');
  figure.dataset.fileId = d.file_id;
  figure.dataset.turnId = turnId;
  const caption = el('figcaption');
  caption.append(el('span', 'file-name', d.name), el('span', 'file-size', humanBytes(d.bytes)));
  figure.append(caption);
  const box = activity(turnId);
  box.append(figure);
  const blob = await fetchFile(d.file_id);
  if (!figure.isConnected) return; // the conversation was left meanwhile
  if (!blob) {
    caption.append(el('span', 'file-error', 'The file could not be loaded.'));
    return;
  }
  const url = URL.createObjectURL(blob);
  objectUrls.add(url);
  if ((d.content_type || '').startsWith('image/')) {
    const img = el('img', 'artifact-image');
    img.alt = nameWords(d.name) + ', an image made for this answer';
    img.src = url;
    figure.prepend(img);
  }
  const link = el('a', 'file-download', 'Download');
  link.href = url;
  link.download = d.name;
  link.setAttribute('aria-label', 'Download ' + d.name);
  caption.append(link);
}

// Move the turn's files under its answer (the bubble of `messageId`, or its latest answer).
export function attachArtifacts(turnId, messageId) {
  const figures = [...transcript().querySelectorAll('.turn-activity .artifact')]
    .filter((f) => f.dataset.turnId === turnId);
  if (!figures.length) return;
  const answer = (messageId && bubble(messageId)) || [...transcript().querySelectorAll('.msg-assistant')]
    .filter((b) => b.dataset.turnId === turnId).pop();
  if (!answer) return;
  const boxes = new Set(figures.map((f) => f.parentElement));
  answer.querySelector('.extras').append(...figures);
  boxes.forEach((box) => { if (!box.children.length) box.remove(); }); // drawn for them alone
}

function humanBytes(n) {
  if (typeof n !== 'number') return '';
  if (n < 1024) return n + ' B';
  return (n / 1024).toFixed(n < 10240 ? 1 : 0) + ' KB';
}

/* ---------- times ---------- */

export function relative(iso, now = Date.now()) {
  const when = new Date(iso);
  const s = Math.round((now - when.getTime()) / 1000);
  if (s < 45) return 'just now';
  const m = Math.round(s / 60);
  if (m < 60) return m + ' min ago';
  const h = Math.round(m / 60);
  if (h < 24) return h + ' h ago';
  const d = Math.round(h / 24);
  if (d === 1) return 'yesterday';
  if (d < 7) return d + ' days ago';
  return dayFormat.format(when);
}
