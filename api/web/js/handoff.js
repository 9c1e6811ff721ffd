// A person of the support team holding the conversation (docs/features/handoff.md): while the
// session's hand-off is open, its stream brings the person joining, their replies (under
// their name) and the hand-back; the customer's own messages go to them, not to a turn.

import { request, sessionPath } from './api.js';
import { followTurn } from './stream.js';
import * as T from './transcript.js';

const ENDED = new Set(['resolved', 'handed_back']);
let current = null; // { sid, id, follow, said: Set of notices already shown }

// Follow the session's open hand-off, if it has one (after a turn, on opening a session, or
// when a post answers with a `handoff_id`); following it already is a no-op. `shown(m)` hears
// of each message drawn (the page's last seq moves with the person's replies).
export async function followCase(sid, shown) {
  const r = await request('GET', sessionPath(sid, 'handoff'));
  if (!r.ok || ENDED.has(r.data.status)) return;
  if (current && current.sid === sid && current.id === r.data.id) return;
  stopCase();
  const mine = { sid, id: r.data.id, said: new Set() };
  mine.follow = followTurn(r.data.events_url, {
    event: (type, d) => onCaseEvent(mine, type, d, shown),
    connection: () => {},
  });
  current = mine;
}

export function stopCase() {
  if (current) current.follow.abort();
  current = null;
}

function onCaseEvent(mine, type, d, shown) {
  if (type === 'message' && T.showMessage(d.message) && shown) shown(d.message);
  if (type !== 'handoff') return false;
  const text = {
    waiting: 'A person from our support team will join this conversation.',
    claimed: (d.agent_name || 'A person') + ' from our support team has joined the conversation.',
    resolved: (d.agent_name || 'Support') + ' has marked your case as resolved.',
    handed_back: (d.agent_name || 'Support') + ' has handed the conversation back to the assistant.',
  }[d.status];
  if (text && !mine.said.has(d.status)) {
    mine.said.add(d.status);
    T.notice(text, 'handoff');
  }
  if (!ENDED.has(d.status)) return false;
  if (current === mine) current = null;
  return true;
}
