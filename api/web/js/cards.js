// Answering a card (confirm or decline), asking again for one that expired, and watching the
// send of a renewed card answered after its turn ended. confirm.js draws the card; app.js
// gives the hooks for what follows an answer.

import { request, sessionPath } from './api.js';
import { expireConfirm, removeConfirm, showConfirm } from './confirm.js';
import { PROGRESS, RESOLVED, S, status } from './state.js';
import { followTurn } from './stream.js';
import * as T from './transcript.js';

// `follow(turnId, url, fromSeq, after)`, `openSession(sid)`, `fail(response)`: app.js's.
let hooks = { follow: () => {}, openSession: async () => {}, fail: () => {} };

export function initCards(given) { hooks = given; }

// The card of `action`, drawn with what its buttons do.
export function showCard(action) {
  showConfirm(action, resolveAction, renewAction);
}

// An expired card stays, offering to ask again.
export function expireCard() {
  expireConfirm(renewAction);
}

async function resolveAction(actionId, verb, action) {
  const r = await request('POST', sessionPath(S.sid, 'actions', actionId, verb));
  if (r.status === 202) {
    status('');
    if (action && action.renewed_from) watchRenewal(action, verb);
    // The waiting turn goes on: follow its stream after the last event shown.
    else if (S.turnId) hooks.follow(S.turnId, sessionPath(S.sid, 'turns', S.turnId, 'events'), S.turnFromSeq, S.seen.get(S.turnId) ?? null);
    return true;
  }
  if (r.error && r.error.code === 'action_expired') { expireCard(); return true; }
  if (r.error && r.error.code === 'action_resolved') { removeConfirm(); await hooks.openSession(S.sid); return true; }
  hooks.fail(r);
  return false;
}

// An expired card asked for again: the same action, a new window (no new answer is written).
// A server whose clock is a little behind this one's may still call it pending: ask again
// after a second, a few times.
async function renewAction(actionId, attempt = 0) {
  const r = await request('POST', sessionPath(S.sid, 'actions', actionId, 'renew'));
  if (r.status === 202) {
    status('');
    showCard(r.data.action);
    return true;
  }
  const early = r.error && r.error.code === 'action_not_expired' && r.error.action?.status === 'pending';
  if (early && attempt < 5) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    return renewAction(actionId, attempt + 1);
  }
  hooks.fail(r);
  return false;
}

// A renewed card is answered after its turn has ended: its send shows on that turn's log,
// read again from where it was left until the send's end is there (for a minute at most).
function watchRenewal(action, verb) {
  if (verb !== 'confirm') {
    removeConfirm();
    T.notice(RESOLVED.declined + action.summary);
    return;
  }
  status(PROGRESS.executing_action, 'progress');
  const gen = S.openGen;
  const url = sessionPath(S.sid, 'turns', action.turn_id, 'events');
  const watch = followTurn(url, {
    event: (type, d) => {
      if (type !== 'tool' || d.call_id !== action.id || d.phase !== 'end') return false;
      watch.abort();
      clearTimeout(giveUp);
      if (gen !== S.openGen) return false;
      removeConfirm();
      status('');
      const sent = d.status === 'ok';
      T.notice((sent ? 'Sent: ' : 'Not sent: ') + action.summary, sent ? 'info' : 'warning');
      return false;
    },
    connection: () => {},
  });
  const giveUp = setTimeout(() => watch.abort(), 60000);
}
