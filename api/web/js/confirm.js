// The confirmation card: what would be sent, to whom, until when; Confirm and Decline are
// bound to the action's id, and a second click sends nothing.

import { append, el } from './transcript.js';

let timer = null;

export function removeConfirm() {
  clearInterval(timer);
  timer = null;
  document.getElementById('confirm-card')?.remove();
}

function countdown(card, expiresAt) {
  const out = card.querySelector('.countdown');
  const tick = () => {
    const left = Math.round((new Date(expiresAt).getTime() - Date.now()) / 1000);
    if (left > 0) {
      const m = Math.floor(left / 60);
      const s = String(left % 60).padStart(2, '0');
      out.textContent = 'Waiting for your answer: ' + m + ':' + s + ' left';
      return;
    }
    expire(card);
  };
  tick();
  timer = setInterval(tick, 1000);
}

function expire(card) {
  clearInterval(timer);
  card.classList.add('expired');
  card.dataset.state = 'expired';
  card.querySelector('.countdown').textContent = 'This request expired; nothing was sent. Ask again if you still want it.';
  card.querySelectorAll('button').forEach((b) => { b.disabled = true; });
}

// `resolve(actionId, verb)` answers a promise of whether the server took it.
export function showConfirm(action, resolve) {
  removeConfirm();
  const card = el('section', 'card confirm-card');
  card.id = 'confirm-card';
  card.dataset.actionId = action.id;
  card.dataset.state = 'pending';
  card.setAttribute('aria-labelledby', 'confirm-title');
  const title = el('h3', 'confirm-title', 'Please confirm');
  title.id = 'confirm-title';
  card.append(title, el('p', 'summary', action.summary));
  const facts = el('dl', 'facts');
  const fact = (name, value) => facts.append(el('dt', '', name), el('dd', '', value));
  fact('To', action.recipient_masked || '—');
  const file = action.attachment;
  if (file && file.name) {
    const rows = typeof file.rows === 'number' ? ' (' + file.rows + (file.rows === 1 ? ' row)' : ' rows)') : '';
    fact('Attachment', file.name + rows);
  }
  card.append(facts, el('p', 'countdown'));
  const yes = el('button', 'primary', 'Confirm');
  yes.id = 'confirm-btn';
  const no = el('button', '', 'Decline');
  no.id = 'decline-btn';
  let answered = false;
  const answer = async (verb) => {
    if (answered) return; // double clicks send once
    answered = true;
    yes.disabled = no.disabled = true;
    card.dataset.state = 'sending';
    const ok = await resolve(action.id, verb);
    if (!ok && card.isConnected) {
      answered = false;
      yes.disabled = no.disabled = false;
      card.dataset.state = 'pending';
    }
  };
  yes.addEventListener('click', () => answer('confirm'));
  no.addEventListener('click', () => answer('decline'));
  const buttons = el('div', 'card-buttons');
  buttons.append(yes, no);
  card.append(buttons);
  append(card);
  if (action.expires_at) countdown(card, action.expires_at);
  if (action.status === 'expired') expire(card);
  return card;
}

export function expireConfirm() {
  const card = document.getElementById('confirm-card');
  if (card) expire(card);
}
