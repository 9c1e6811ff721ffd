// What the Node tests share: the `ai` package's `Chat` with a plain state (what a UI
// framework's package adds), made as a useChat user makes it, and small readers of its
// messages. Imported by chat.test.mjs and faults.test.mjs.

import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from 'ai';

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

// A chat of a Parley session on `url`'s AI SDK endpoint, as `token`'s user.
export function chatOn(url, token, sessionId, { fetch } = {}) {
  return new Chat({
    id: sessionId,
    transport: new DefaultChatTransport({
      api: `${url}/v1/ai-sdk/chat`,
      headers: { Authorization: `Bearer ${token}` },
      fetch,
    }),
    // What useChat users set so that answering an approval sends it (the AI SDK's docs).
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
}

export async function until(what, check) {
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise(resolve => setTimeout(resolve, 25));
  }
}

export const textOf = message =>
  message.parts
    .filter(p => p.type === 'text')
    .map(p => p.text)
    .join('');
export const parts = (message, type) => message.parts.filter(p => p.type === type);
export const lastAnswer = chat => chat.messages.at(-1);
