// Stop: the running answer is cancelled; when a message waits as the next turn, the page
// first asks whether to drop it too or keep it for after (api.md, Cancel).

import { request, sessionPath } from './api.js';
import { $, S, status } from './state.js';

let fail = () => {};

// `onFailure(response)`: app.js's `fail`. Wires the Stop button and the question's two.
export function initStop(onFailure) {
  fail = onFailure;
  $('stop').addEventListener('click', stop);
  $('drop-queued').addEventListener('click', () => stopWith(true));
  $('keep-queued').addEventListener('click', () => stopWith(false));
}

async function stop() {
  if (!S.turnId) return;
  // A message on its way to the queue is asked about too, once the server has it (unless
  // the answer Stop was meant for ended meanwhile: the next one was not asked to stop).
  const running = S.turnId;
  if (S.queueing) await S.queueing;
  if (S.turnId !== running) return;
  if (S.queued) { // ask first: drop the waiting message too, or keep it for next?
    $('stop-queued').hidden = false;
    $('drop-queued').focus();
    return;
  }
  await stopRunning();
}

async function stopWith(dropQueued) {
  $('stop-queued').hidden = true;
  const q = S.queued;
  if (dropQueued && q) { // before the running turn: once that ends, the queued one starts
    const r = await request('POST', sessionPath(S.sid, 'turns', q.turnId, 'cancel'));
    if (r.status === 202 || r.error?.code === 'turn_finished') { q.bubble.remove(); S.queued = null; }
  }
  await stopRunning();
}

async function stopRunning() {
  const r = await request('POST', sessionPath(S.sid, 'turns', S.turnId, 'cancel'));
  if (r.status === 202) status('Stopping…', 'progress');
  else if (!(r.error && r.error.code === 'turn_finished')) fail(r);
}
