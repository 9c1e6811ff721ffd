// What the chat page's modules share: the page's state (`S`), the status line, and the words
// and sets a turn's events are read by. app.js owns the flow; the modules it wires read and
// write `S` as it does.

export const $ = (id) => document.getElementById(id);

export const S = {
  demoUsers: [],
  sid: null, lastSeq: 0, sessions: [],
  follow: null, turnId: null, turnFromSeq: 0, busy: false,
  options: null, replacing: null, openGen: 0,
  queued: null, // a message sent while an answer streams: { turnId, url, bubble }
  queueing: null, // that message's POST, until it answers (Stop waits for it)
  posting: null, // a message's POST, until it answers (the session stream waits for it)
  live: null, // the open conversation's session stream (live.js)
  streaming: null, // the turn whose own stream this tab reads now
  seen: new Map(), // turn id -> the last of its events drawn, from either stream
  ended: new Set(), // turns drawn to their terminal event
  deleting: null, // a conversation this tab is deleting
};

// What the status line says while a turn is in each state.
export const PROGRESS = {
  received: 'Starting…',
  building_context: 'Thinking…',
  calling_model: 'Writing…',
  executing_tools: 'Looking that up…',
  awaiting_confirmation: 'Waiting for your confirmation',
  awaiting_input: 'Waiting for your answer',
  executing_action: 'Sending…',
};
export const TERMINAL = new Set(['done', 'error', 'cancelled']);
export const RESTING = new Set(['confirmation_required', 'interaction']);

// How a card ended, as the transcript says it (each outcome its own words).
export const RESOLVED = {
  confirmed: 'You confirmed: ',
  declined: 'You declined: ',
  expired: 'Expired, nothing sent: ',
  superseded: 'Set aside when you moved on: ',
};

export function status(text, kind) {
  const s = $('status');
  s.textContent = text || '';
  s.dataset.kind = kind || '';
}
