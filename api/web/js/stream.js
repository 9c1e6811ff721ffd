// Following one turn's event stream (fetch + a text/event-stream parser, since EventSource
// cannot send the bearer token). A connection that drops before a terminal event is opened
// again with `Last-Event-ID`, so nothing is missed or shown twice.

import { auth } from './api.js';

const RECONNECT_MS = [500, 1000, 2000, 3000];

// `handlers.event(type, data, fromScratch, id)` returns true for a terminal event;
// `handlers.connection('live' | 'reconnecting' | 'closed', outcome, detail)` reports the link.
// `after` is the last event id already shown (null replays the turn from its start).
export function followTurn(url, handlers, after = null) {
  const ctrl = new AbortController();
  const follow = { lastEventId: after, abort: () => ctrl.abort(), done: null };
  follow.done = (async () => {
    let failures = 0;
    while (!ctrl.signal.aborted) {
      let outcome;
      try {
        outcome = await readOnce(url, follow, handlers, ctrl.signal);
      } catch (_) {
        outcome = 'dropped';
      }
      if (ctrl.signal.aborted) return 'aborted';
      if (outcome !== 'dropped') {
        handlers.connection('closed', outcome, follow.failure);
        return outcome;
      }
      handlers.connection('reconnecting');
      await pause(RECONNECT_MS[Math.min(failures, RECONNECT_MS.length - 1)], ctrl.signal);
      failures += 1;
    }
    return 'aborted';
  })();
  return follow;
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// One connection: 'terminal' | 'paused' (the turn waits for the user) | 'fatal' | 'dropped'.
async function readOnce(url, follow, handlers, signal) {
  const headers = { Authorization: 'Bearer ' + auth.token, Accept: 'text/event-stream' };
  const fromScratch = follow.lastEventId === null; // the server replays the whole turn
  if (!fromScratch) headers['Last-Event-ID'] = follow.lastEventId;
  const res = await fetch(url, { headers, signal, cache: 'no-store' });
  if (!res.ok || !res.body) {
    if (res.status >= 500 || res.status === 429) return 'dropped';
    const data = await res.json().catch(() => null);
    follow.failure = { status: res.status, error: data && data.error };
    return 'fatal';
  }
  handlers.connection('live');
  let paused = false;
  let terminal = false;
  const parser = sseParser((id, type, raw) => {
    if (id !== null) follow.lastEventId = id;
    let data;
    try { data = JSON.parse(raw); } catch (_) { return; }
    if (type === 'confirmation_required' || type === 'interaction') paused = true;
    if (type === 'confirmation_resolved') paused = false;
    if (handlers.event(type, data, fromScratch, Number(id))) terminal = true;
  });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    parser.feed(decoder.decode(value, { stream: true }));
    if (terminal) {
      reader.cancel().catch(() => {});
      return 'terminal';
    }
  }
  return paused ? 'paused' : 'dropped';
}

// text/event-stream parsing (the WHATWG rules for the fields the API sends); live.js too.
export function sseParser(dispatch) {
  let buffer = '';
  let data = [];
  let type = '';
  let id = null;
  function line(text) {
    if (text === '') {
      if (data.length) dispatch(id, type || 'message', data.join('\n'));
      data = []; type = ''; id = null;
      return;
    }
    if (text[0] === ':') return; // a comment (keep-alive)
    const colon = text.indexOf(':');
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? '' : text.slice(colon + 1);
    if (value[0] === ' ') value = value.slice(1);
    if (field === 'data') data.push(value);
    else if (field === 'event') type = value;
    else if (field === 'id' && !value.includes('\0')) id = value;
  }
  return {
    feed(chunk) {
      buffer += chunk;
      let i;
      while ((i = buffer.search(/[\r\n]/)) >= 0) {
        if (buffer[i] === '\r' && i === buffer.length - 1) break; // a CRLF split across chunks
        const text = buffer.slice(0, i);
        buffer = buffer.slice(i + (buffer[i] === '\r' && buffer[i + 1] === '\n' ? 2 : 1));
        line(text);
      }
    },
  };
}
