// The `ai` package's own client (the version package-lock.json pins) against Parley's AI SDK
// chat endpoint on a live stack, run with node's test runner by two tests: against the
// in-process stack (tests/node/test_ai_sdk_client.py) and against the stack `make run` starts
// (tests/system/test_make_run.py). Nothing here knows which: only the environment differs.
//
// Environment: PARLEY_URL, PARLEY_TOKEN (Priya's bearer token), AGENT_TOKEN (Sam's, of the
// support team), NORTHWIND_URL (the demo backend, whose /emails lists what the email service
// accepted), LONG_QUESTION (a message whose answer comes slowly enough, and is long enough,
// to be interrupted after its first words).

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DefaultChatTransport, readUIMessageStream } from 'ai';

import { chatOn, lastAnswer, parts, textOf, until } from './ui-chat.mjs';

const { PARLEY_URL, PARLEY_TOKEN, AGENT_TOKEN, NORTHWIND_URL, LONG_QUESTION } = process.env;
const AUTH = { Authorization: `Bearer ${PARLEY_TOKEN}` };
const AGENT = { Authorization: `Bearer ${AGENT_TOKEN}` };
const CHAT_API = `${PARLEY_URL}/v1/ai-sdk/chat`;

const newChat = (sessionId, options) => chatOn(PARLEY_URL, PARLEY_TOKEN, sessionId, options);

async function parley(path, init = {}, auth = AUTH) {
  const response = await fetch(`${PARLEY_URL}${path}`, {
    ...init,
    headers: { ...auth, 'content-type': 'application/json', ...(init.headers ?? {}) },
  });
  const body = response.status === 204 ? null : await response.json();
  return { status: response.status, body };
}

async function newSession() {
  const { status, body } = await parley('/v1/sessions', { method: 'POST' });
  assert.equal(status, 201);
  return body.id;
}

async function storedMessages(sessionId) {
  const { status, body } = await parley(`/v1/sessions/${sessionId}/messages`);
  assert.equal(status, 200);
  return body.messages;
}

async function emailsFor(actionId) {
  const response = await fetch(`${NORTHWIND_URL}/emails`);
  const { emails } = await response.json();
  return emails.filter(e => e.idempotency_key === `parley-${actionId}`);
}

const wordsOf = text => text.split(/\s+/).filter(Boolean).length;

async function say(chat, text) {
  await chat.sendMessage({ text });
  assert.equal(chat.status, 'ready', String(chat.error));
  const answer = lastAnswer(chat);
  assert.equal(answer.role, 'assistant');
  return answer;
}

// Each UI message's text parts are Parley's assistant messages of its turn, under their ids.
async function assertSameTextAsStored(chat, sessionId) {
  const stored = new Map((await storedMessages(sessionId)).map(m => [m.id, m]));
  // (An answer while a person holds the session is no turn: it has a data-handoff part only.)
  const answers = chat.messages.filter(m => m.role === 'assistant' && m.metadata?.turn_id);
  for (const answer of answers) {
    const turnId = answer.metadata.turn_id;
    const shown = parts(answer, 'text').filter(p => p.text);
    const written = [...stored.values()].filter(
      m => m.role === 'assistant' && m.turn_id === turnId && m.text,
    );
    assert.deepEqual(
      shown.map(p => [p.providerMetadata.parley.message_id, p.text]),
      written.map(m => [m.id, m.text]),
      `turn ${turnId}`,
    );
  }
}

test("Priya's seven turns through the ai client, the email sent once after the approval", async () => {
  const sessionId = await newSession();
  const chat = newChat(sessionId);

  const first = await say(chat, 'Where is my order?');
  assert.match(textOf(first), /8472/);
  assert.match(textOf(first), /Oct 30/);
  const looked = parts(first, 'dynamic-tool');
  assert.deepEqual(
    looked.map(p => [p.toolName, p.state]),
    [['list_open_orders', 'output-available']],
  );
  assert.equal(first.metadata.status, 'complete');

  const second = await say(chat, 'What about the refund?');
  assert.match(textOf(second), /On order 8472/);
  assert.match(textOf(second), /24\.00/);

  // 3: the proposal is the SDK's approval request; nothing is sent before the answer.
  const proposal = await say(chat, 'Can you email me?');
  const [card] = parts(proposal, 'dynamic-tool').filter(p => p.state === 'approval-requested');
  assert.ok(card, JSON.stringify(proposal.parts));
  assert.equal(card.toolName, 'send_email');
  assert.equal(card.input.recipient_masked, 'p***@example.com');
  assert.match(card.input.summary, /8472/);
  assert.deepEqual(await emailsFor(card.approval.id), []);

  // 4: the approval goes out with the next request (sendAutomaticallyWhen), as useChat does.
  await chat.addToolApprovalResponse({ id: card.approval.id, approved: true });
  const sent = await until('the send to finish', () => {
    const answer = lastAnswer(chat);
    const tool = answer.parts.find(p => p.toolCallId === card.toolCallId);
    return chat.status === 'ready' && answer.metadata.status && tool?.state === 'output-available'
      ? answer
      : null;
  });
  assert.equal(sent.id, proposal.id, 'the approval continues the same message');
  assert.match(textOf(sent), /sent|accepted/i);
  assert.match(textOf(sent), /p\*\*\*@example\.com/);
  assert.equal((await emailsFor(card.approval.id)).length, 1);

  // 5: one clarification, its options as a data part.
  const asked = await say(chat, 'Thanks. And the other one?');
  const [clarification] = parts(asked, 'data-clarification');
  assert.deepEqual(
    clarification.data.options.map(o => o.label),
    ['Order 8390', 'Refund R-5102'],
  );
  assert.equal(textOf(asked), clarification.data.question);

  const returnable = await say(chat, 'The order. Can I still return it?');
  assert.match(textOf(returnable), /4 days/);
  assert.match(textOf(returnable), /8390/);
  const arrived = await say(chat, 'When did it arrive?');
  assert.match(textOf(arrived), /Oct 2/);
  assert.doesNotMatch(textOf(arrived), /8472/);

  // Six user messages, six answers: the approval continued the third answer.
  assert.equal(chat.messages.length, 12);
  await assertSameTextAsStored(chat, sessionId);
  assert.equal((await emailsFor(card.approval.id)).length, 1);
});

test('resending the same user message id creates no second turn', async () => {
  const sessionId = await newSession();
  const transport = new DefaultChatTransport({ api: CHAT_API, headers: AUTH });
  const message = { id: 'msg-once-1', role: 'user', parts: [{ type: 'text', text: 'Where is my order?' }] };
  const answers = [];
  for (let i = 0; i < 2; i++) {
    const stream = await transport.sendMessages({
      chatId: sessionId,
      messages: [message],
      trigger: 'submit-message',
      messageId: undefined,
      abortSignal: undefined,
    });
    let last;
    for await (const built of readUIMessageStream({ stream })) last = built;
    answers.push(last);
  }
  assert.equal(answers[0].metadata.turn_id, answers[1].metadata.turn_id);
  assert.equal(textOf(answers[0]), textOf(answers[1]));
  const stored = await storedMessages(sessionId);
  assert.equal(stored.filter(m => m.role === 'user').length, 1);
  assert.equal(new Set(stored.map(m => m.turn_id)).size, 1);
});

test('stop mid-answer ends the turn cancelled on both sides', async () => {
  const sessionId = await newSession();
  const chat = newChat(sessionId);
  const sending = chat.sendMessage({ text: LONG_QUESTION });
  const answer = await until('the answer to stream', () => {
    const last = lastAnswer(chat);
    return last?.role === 'assistant' && wordsOf(textOf(last)) >= 5 ? last : null;
  });
  await chat.stop();
  await sending;
  const turnId = answer.metadata.turn_id;
  const turn = await until('the turn to end', async () => {
    const { body } = await parley(`/v1/sessions/${sessionId}/turns/${turnId}`);
    return ['cancelled', 'completed'].includes(body.state) ? body : null;
  });
  assert.equal(turn.state, 'cancelled');
  assert.equal(chat.status, 'ready');
  const shown = textOf(lastAnswer(chat));
  const stored = (await storedMessages(sessionId)).filter(m => m.role === 'assistant');
  assert.equal(stored.at(-1).status, 'cancelled');
  assert.ok(stored.at(-1).text.startsWith(shown), 'the client shows a prefix of what was kept');
  // Nothing runs any more: a reload has nothing to resume.
  const resumed = await fetch(`${CHAT_API}/${sessionId}/stream`, { headers: AUTH });
  assert.equal(resumed.status, 204);
});

test('a resume after the connection drops mid-answer gives the full text once', async () => {
  const sessionId = await newSession();
  let cut = true;
  // The network goes away once the answer has begun: the body breaks off mid-stream, after
  // the answer's fifth text delta.
  const droppingFetch = async (url, init) => {
    const response = await fetch(url, init);
    if (!cut || init?.method !== 'POST') return response;
    cut = false;
    let seen = '';
    const decoder = new TextDecoder();
    const breaking = new TransformStream({
      transform(bytes, controller) {
        seen += decoder.decode(bytes, { stream: true });
        if ((seen.match(/"type":"text-delta"/g) ?? []).length >= 5) {
          controller.error(new TypeError('network connection lost'));
          return;
        }
        controller.enqueue(bytes);
      },
    });
    return new Response(response.body.pipeThrough(breaking), {
      status: response.status,
      headers: response.headers,
    });
  };
  const chat = newChat(sessionId, { fetch: droppingFetch });
  await chat.sendMessage({ text: LONG_QUESTION });
  const partial = textOf(lastAnswer(chat));

  await chat.resumeStream(); // what useChat({ resume: true }) does after a reload
  assert.equal(chat.status, 'ready', String(chat.error));
  const answers = chat.messages.filter(m => m.role === 'assistant');
  assert.equal(answers.length, 1);
  const [stored] = (await storedMessages(sessionId)).filter(m => m.role === 'assistant');
  assert.equal(stored.status, 'complete');
  assert.ok(partial.length < stored.text.length, 'the drop came mid-answer');
  assert.equal(textOf(answers[0]), stored.text);
  assert.equal(parts(answers[0], 'text').length, 1);
  await assertSameTextAsStored(chat, sessionId);
});

// A person of the support team: while they hold the session, a message goes to them and no
// turn runs (docs/api.md, Hand-off to a person); the answer is a `data-handoff` part.
test('a person takes the conversation: data-handoff parts, then the assistant again', async () => {
  const sessionId = await newSession();
  const chat = newChat(sessionId);
  const asked = await say(chat, 'I want to talk to a person');
  const { status, body: handoff } = await parley(`/v1/sessions/${sessionId}/handoff`);
  assert.equal(status, 200);
  assert.equal(handoff.status, 'waiting');
  assert.deepEqual(
    parts(asked, 'data-handoff').map(p => p.data.handoff_id),
    [handoff.id],
  );
  assert.equal(textOf(asked), '');

  const held = await say(chat, 'My parcel is late and I am worried.');
  assert.deepEqual(
    parts(held, 'data-handoff').map(p => p.data.handoff_id),
    [handoff.id],
  );
  const waiting = await storedMessages(sessionId);
  assert.deepEqual(
    waiting.filter(m => m.role === 'user').map(m => m.text),
    ['I want to talk to a person', 'My parcel is late and I am worried.'],
  );
  assert.deepEqual(
    waiting.filter(m => m.turn_id),
    [],
    'no turn ran, no model answered',
  );
  const handoffUrl = `/v1/handoffs/${handoff.id}`;
  const read = await parley(handoffUrl, {}, AGENT);
  assert.equal(read.body.messages.at(-1).text, 'My parcel is late and I am worried.');

  // Sam claims it, answers, and hands the conversation back to the assistant.
  for (const step of ['claim', 'hand-back']) {
    const { status: moved } = await parley(`${handoffUrl}/${step}`, { method: 'POST' }, AGENT);
    assert.equal(moved, 200, step);
    if (step === 'claim') {
      const said = await parley(
        `${handoffUrl}/messages`,
        { method: 'POST', body: JSON.stringify({ text: 'Hi Priya, Sam here.' }) },
        AGENT,
      );
      assert.equal(said.status, 201);
    }
  }
  const answered = await say(chat, 'Where is my order?');
  assert.deepEqual(parts(answered, 'data-handoff'), []);
  assert.equal(answered.metadata.status, 'complete');
  assert.match(textOf(answered), /8472/);
  await assertSameTextAsStored(chat, sessionId);
});
