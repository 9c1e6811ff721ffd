// A model provider that misbehaves during an AI SDK chat: the `ai` package's own client sees
// the answer end with the protocol's error part, never a stream left hanging. The stack's
// model is an OpenAI-compatible provider, the fake server (parley.gateway.fake_provider)
// scripted per test over its control endpoint; tests/node/test_ai_sdk_faults.py starts both.
//
// Environment: PARLEY_URL, PARLEY_TOKEN (Priya's bearer token), FAKE_URL (the fake provider),
// MODEL_ATTEMPTS (how many times a model call is tried before the turn fails).

import assert from 'node:assert/strict';
import { beforeEach, test } from 'node:test';

import { chatOn, lastAnswer, parts } from './ui-chat.mjs';

const { PARLEY_URL, PARLEY_TOKEN, FAKE_URL, MODEL_ATTEMPTS } = process.env;
const AUTH = { Authorization: `Bearer ${PARLEY_TOKEN}`, 'content-type': 'application/json' };

async function fake(path, body) {
  const response = await fetch(`${FAKE_URL}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body ?? {}),
  });
  assert.equal(response.status, 200);
}

// Every attempt at the model call gets the same misbehaviour.
const everyAttempt = item => fake('/_fake/script', Array(Number(MODEL_ATTEMPTS)).fill(item));

async function requestsSeen() {
  const response = await fetch(`${FAKE_URL}/_fake/requests`);
  return (await response.json()).length;
}

async function answerTo(text) {
  const created = await fetch(`${PARLEY_URL}/v1/sessions`, { method: 'POST', headers: AUTH });
  const sessionId = (await created.json()).id;
  const chat = chatOn(PARLEY_URL, PARLEY_TOKEN, sessionId);
  await chat.sendMessage({ text }); // returns once the stream has ended
  const answer = lastAnswer(chat);
  const turnId = answer.metadata.turn_id;
  const turn = await fetch(`${PARLEY_URL}/v1/sessions/${sessionId}/turns/${turnId}`, {
    headers: AUTH,
  });
  return { chat, answer, turn: await turn.json() };
}

beforeEach(() => fake('/_fake/reset'));

// The answer ends as Parley's own stream ends it (an `error` event, the turn `failed`), and the
// client knows it: its status `error`, the error part's text, and the code before it.
function assertEndedWithError({ chat, answer, turn }) {
  assert.equal(chat.status, 'error');
  assert.equal(chat.error.message, 'the assistant could not finish this answer');
  assert.equal(answer.role, 'assistant');
  assert.deepEqual(parts(answer, 'text'), []);
  assert.deepEqual(
    parts(answer, 'data-error').map(p => [p.data.code, p.data.retryable]),
    [['model_failed', true]],
  );
  assert.equal(turn.state, 'failed');
}

test('a provider answering in the wrong format ends the answer with the error part', async () => {
  // A JSON body with status 200 where the event stream should be (a proxy's page, say).
  await everyAttempt({ status: 200, message: 'not a stream' });
  assertEndedWithError(await answerTo('Where is my order?'));
  assert.equal(await requestsSeen(), Number(MODEL_ATTEMPTS));
});

test('a provider that says nothing ends the answer with the error part', async () => {
  // Not even the headers: each attempt meets the first-token timeout.
  await everyAttempt({ stall_s: 30 });
  assertEndedWithError(await answerTo('Where is my order?'));
  assert.equal(await requestsSeen(), Number(MODEL_ATTEMPTS));
});
