// The confirmation card: what would be sent, to whom, until when (the expiry time and a
// countdown); Confirm and Decline are bound to the action's id, and a second click sends
// nothing. A card whose window passed offers "Ask again" (a renewal: the same action, a new
// window, no new answer from the assistant).

import { append, el } from './transcript.js';

let timer = null;

export function removeConfirm() {
  clearInterval(timer);
  timer = null;
  document.getElementById('confirm-card')?.remove();
}

function clockTime(iso) {
  return new Date(iso).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

function countdown(card, expiresAt, renew) {
  const out = card.querySelector('.countdown');
  const tick = () => {
    // Rounded up: the card shows expired only once the server's `expires_at` has passed.
    const left = Math.ceil((new Date(expiresAt).getTime() - Date.now()) / 1000);
    if (left > 0) {
      const m = Math.floor(left / 60);
      const s = String(left % 60).padStart(2, '0');
      out.querySelector('.left').textContent = m + ':' + s + ' left';
      return;
    }
    expire(card, renew);
  };
  out.textContent = 'Expires at ';
  const at = el('time', '', clockTime(expiresAt));
  at.dateTime = expiresAt;
  out.append(at, ' · ', el('span', 'left'));
  tick();
  timer = setInterval(tick, 1000);
}

function expire(card, renew) {
  clearInterval(timer);
  card.classList.remove('expiring');
  card.querySelector('.expiring-note').hidden = true;
  card.classList.add('expired');
  card.dataset.state = 'expired';
  card.querySelector('.countdown').textContent = 'This request expired; nothing was sent.';
  card.querySelectorAll('.card-buttons button:not(.renew-btn)').forEach((b) => { b.disabled = true; });
  if (!renew || card.querySelector('.renew-btn')) return;
  const again = el('button', 'renew-btn primary', 'Ask again');
  again.id = 'renew-btn';
  again.type = 'button';
  again.addEventListener('click', async () => {
    if (again.disabled) return; // a double click asks once
    again.disabled = true;
    if (!(await renew(card.dataset.actionId)) && card.isConnected) again.disabled = false;
  });
  card.querySelector('.card-buttons').append(again);
}

// `resolve(actionId, verb, action)` answers a promise of whether the server took it;
// `renew(actionId)` the same for asking again once the card expired.
export function showConfirm(action, resolve, renew) {
  removeConfirm();
  const card = el('section', 'card confirm-card');
  card.id = 'confirm-card';
  card.dataset.actionId = action.id;
  card.dataset.state = 'pending';
  if (action.renewed_from) card.dataset.renewedFrom = action.renewed_from;
  card.setAttribute('aria-labelledby', 'confirm-title');
  const title = el('h3', 'confirm-title', action.renewed_from ? 'Please confirm (asked again)' : 'Please confirm');
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
  const clock = el('p', 'countdown');
  clock.setAttribute('role', 'timer');
  const warning = el('p', 'expiring-note', 'This request expires soon.');
  warning.setAttribute('role', 'status');
  warning.hidden = true;
  card.append(facts, clock, warning);
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
    const ok = await resolve(action.id, verb, action);
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
  if (action.status === 'expired') expire(card, renew);
  else if (action.expires_at) countdown(card, action.expires_at, renew);
  return card;
}

// The card's window is over (the server said so): it offers to ask again.
export function expireConfirm(renew) {
  const card = document.getElementById('confirm-card');
  if (card) expire(card, renew);
}

// `confirmation_expiring`: the card lapses soon; say so where a screen reader hears it.
export function warnConfirm(action) {
  const card = document.getElementById('confirm-card');
  if (!card || card.dataset.actionId !== action.id || card.dataset.state !== 'pending') return;
  card.classList.add('expiring');
  card.querySelector('.expiring-note').hidden = false;
}
