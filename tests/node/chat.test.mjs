// The `ai` package's own client (the version package-lock.json pins) against Parley's AI SDK
// chat endpoint on a live stack: tests/node/test_ai_sdk_client.py starts the stack, installs
// the pinned packages and runs this file with node's test runner.
//
// Environment: PARLEY_URL, PARLEY_TOKEN (Priya's bearer token), NORTHWIND_URL (the demo
// backend, whose /emails lists what the email service accepted), LONG (the reply the stack's
// model gives to a message with the word "long", slow enough to interrupt).

import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
} from 'ai';

const { PARLEY_URL, PARLEY_TOKEN, NORTHWIND_URL, LONG } = process.env;
const AUTH = { Authorization: `Bearer ${PARLEY_TOKEN}` };
const CHAT_API = `${PARLEY_URL}/v1/ai-sdk/chat`;
const DEADLINE_MS = 30_000;

// The state a UI framework would keep (the React, Vue and Svelte packages each have one);
// plain arrays here, replaced on each change as the frameworks do.
class PlainState {
  status = 'ready';
  error = undefined;
  messages = [];
  pushMessage = message => {
    this.messages = [...this.messages, message];
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = this.messages.map((m, i) => (i === index ? message : m));
  };
  snapshot = thing => structuredClone(thing);
}

class Chat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new PlainState() });
  }
}

function newChat(sessionId, { fetch } = {}) {
  return new Chat({
    id: sessionId,
    transport: new DefaultChatTransport({ api: CHAT_API, headers: AUTH, fetch }),
    // What useChat users set so that answering an approval sends it (the AI SDK's docs).
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
}

async function parley(path, init = {}) {
  const response = await fetch(`${PARLEY_URL}${path}`, {
    ...init,
    headers: { ...AUTH, 'content-type': 'application/json', ...(init.headers ?? {}) },
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

async function until(what, check) {
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise(resolve => setTimeout(resolve, 25));
  }
}

const textOf = message =>
  message.parts
    .filter(p => p.type === 'text')
    .map(p => p.text)
    .join('');
const lastAnswer = chat => chat.messages.at(-1);
const parts = (message, type) => message.parts.filter(p => p.type === type);

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
  const answers = chat.messages.filter(m => m.role === 'assistant');
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
  const sending = chat.sendMessage({ text: 'A long answer please' });
  const answer = await until('the answer to stream', () => {
    const last = lastAnswer(chat);
    return last?.role === 'assistant' && textOf(last).includes('word5 ') ? last : null;
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
  assert.notEqual(stored.at(-1).text, LONG);
  // Nothing runs any more: a reload has nothing to resume.
  const resumed = await fetch(`${CHAT_API}/${sessionId}/stream`, { headers: AUTH });
  assert.equal(resumed.status, 204);
});

test('a resume after the connection drops mid-answer gives the full text once', async () => {
  const sessionId = await newSession();
  let cut = true;
  // The network goes away once the answer has begun: the body breaks off mid-stream.
  const droppingFetch = async (url, init) => {
    const response = await fetch(url, init);
    if (!cut || init?.method !== 'POST') return response;
    cut = false;
    let seen = '';
    const decoder = new TextDecoder();
    const breaking = new TransformStream({
      transform(bytes, controller) {
        seen += decoder.decode(bytes, { stream: true });
        if (seen.includes('word5 ')) {
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
  await chat.sendMessage({ text: 'A long answer please' });
  const partial = textOf(lastAnswer(chat));
  assert.ok(partial.length < LONG.length, 'the drop came mid-answer');

  await chat.resumeStream(); // what useChat({ resume: true }) does after a reload
  assert.equal(chat.status, 'ready', String(chat.error));
  const answers = chat.messages.filter(m => m.role === 'assistant');
  assert.equal(answers.length, 1);
  assert.equal(textOf(answers[0]), LONG);
  assert.equal(parts(answers[0], 'text').length, 1);
  await assertSameTextAsStored(chat, sessionId);
});
