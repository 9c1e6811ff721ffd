// The session stream (api.md, The session stream): what other tabs and devices do in the open
// conversation, live. One stream per open conversation, read like a turn's (fetch, since
// EventSource cannot send the bearer token); a dropped connection is opened again with the
// last frame's id as `Last-Event-ID`, so nothing is missed or shown twice.

import { auth, sessionPath } from './api.js';
import { sseParser } from './stream.js';

const RECONNECT_MS = [500, 1000, 2000, 4000];

// `onFrame(type, data)` gets every frame (`ready` first on each connection); the stream ends
// for good on a refusal (the conversation is gone, or the sign-in is) and after
// `session_deleted`. `from`: where the first connection takes up (the transcript's `cursor`),
// else from now.
export function followSession(sid, onFrame, from) {
  const ctrl = new AbortController();
  let cursor = from || null;
  (async () => {
    let failures = 0;
    while (!ctrl.signal.aborted) {
      let outcome;
      try {
        outcome = await readOnce();
      } catch (_) {
        outcome = 'dropped';
      }
      if (outcome === 'ended' || ctrl.signal.aborted) return;
      if (outcome === 'live') failures = 0;
      await pause(RECONNECT_MS[Math.min(failures, RECONNECT_MS.length - 1)], ctrl.signal);
      failures += 1;
    }
  })();

  async function readOnce() {
    const headers = { Authorization: 'Bearer ' + auth.token, Accept: 'text/event-stream' };
    if (cursor !== null) headers['Last-Event-ID'] = cursor;
    const res = await fetch(sessionPath(sid, 'stream'), { headers, signal: ctrl.signal, cache: 'no-store' });
    if (!res.ok || !res.body) return res.status >= 500 || res.status === 429 ? 'dropped' : 'ended';
    let ended = false;
    let live = false;
    const parser = sseParser((id, type, raw) => {
      if (id !== null) cursor = id;
      live = true;
      let data;
      try { data = JSON.parse(raw); } catch (_) { return; }
      // Following from here on: what another device does from now shows in this tab.
      if (type === 'ready') document.documentElement.dataset.liveSession = sid;
      if (type === 'session_deleted') ended = true;
      onFrame(type, data);
    });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.feed(decoder.decode(value, { stream: true }));
      if (ended) {
        reader.cancel().catch(() => {});
        return 'ended';
      }
    }
    return live ? 'live' : 'dropped';
  }

  return {
    abort: () => {
      ctrl.abort();
      if (document.documentElement.dataset.liveSession === sid) {
        delete document.documentElement.dataset.liveSession;
      }
    },
  };
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}
