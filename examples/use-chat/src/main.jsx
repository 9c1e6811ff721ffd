// A minimal chat page on @ai-sdk/react's useChat against Parley's AI SDK endpoint
// (docs/features/ai-sdk.md). Nothing here knows Parley's own event vocabulary: the answer
// streams as the SDK's text parts, Parley's tools show as dynamic tool parts, a confirmation
// is the SDK's approval request, and a clarification's options are a data part.
//
// Built once into api/web/examples/use-chat.js (`make example-page`); `make run` serves it
// at /examples/use-chat. The bearer token is the chat page's (same tab), or one pasted here.
// The conversation's id is kept in the address (`?chat=<session id>`): a reload shows the
// conversation again and follows a running answer through the SDK's resume request.

import { useChat } from '@ai-sdk/react';
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from 'ai';
import { StrictMode, useEffect, useState } from 'react';
import { createRoot } from 'react-dom/client';

const TOKEN_KEY = 'parley_token'; // the chat page's own key (api/web/js/api.js)

async function newSession(token) {
  const response = await fetch('/v1/sessions', {
    method: 'POST',
    headers: { Authorization: `Bearer ${token}` },
  });
  if (!response.ok) throw new Error(`could not start a conversation (${response.status})`);
  return (await response.json()).id;
}

// Parley's stored messages (`GET .../messages`) as the UI messages the stream would have
// built: a user message each, one assistant message per turn (its id the turn's, as the
// stream's), its tools as dynamic tool parts and its texts as text parts. A running turn's
// message is then replaced whole by the resume's replay, which carries the same id.
function uiMessages(stored) {
  const shown = [];
  for (const m of stored) {
    if (m.role === 'user') {
      shown.push({ id: m.id, role: 'user', parts: [{ type: 'text', text: m.text }] });
      continue;
    }
    const id = m.turn_id ?? m.id;
    let answer = shown.at(-1);
    if (answer?.id !== id) {
      answer = { id, role: 'assistant', metadata: { turn_id: m.turn_id }, parts: [] };
      shown.push(answer);
    }
    if (m.role === 'tool') {
      const ok = m.tool.status === 'ok';
      answer.parts.push({
        type: 'dynamic-tool',
        toolName: m.tool.name,
        toolCallId: m.tool_call_id ?? m.id,
        title: m.tool.label,
        input: {},
        ...(ok
          ? { state: 'output-available', output: { status: m.tool.status, label: m.tool.label } }
          : { state: 'output-error', errorText: m.tool.status }),
      });
    } else if (m.text) {
      answer.parts.push({ type: 'text', text: m.text, state: 'done' });
    }
  }
  return shown;
}

// The conversation the address names, when it is the user's; otherwise a new one, whose id
// the address then keeps (so a reload comes back to it).
async function openConversation(token) {
  const kept = new URLSearchParams(location.search).get('chat');
  if (kept) {
    const response = await fetch(`/v1/sessions/${encodeURIComponent(kept)}/messages`, {
      headers: { Authorization: `Bearer ${token}` },
    });
    if (response.ok) {
      const { messages } = await response.json();
      return { sessionId: kept, history: uiMessages(messages), reopened: true };
    }
  }
  const sessionId = await newSession(token);
  const address = new URL(location.href);
  address.searchParams.set('chat', sessionId);
  history.replaceState(null, '', address);
  return { sessionId, history: [], reopened: false };
}

function SignIn({ onToken }) {
  const [demo, setDemo] = useState([]);
  const [typed, setTyped] = useState('');
  useEffect(() => {
    fetch('/web/config')
      .then(r => r.json())
      .then(config => setDemo(config.demo_users ?? []))
      .catch(() => setDemo([]));
  }, []);
  const signInAs = async user => {
    const response = await fetch(`/dev/sign-in/${user.tenant_id}/${user.user_id}`, { method: 'POST' });
    if (response.ok) onToken((await response.json()).token);
  };
  return (
    <main className="signin">
      <h2>Sign in</h2>
      {demo.length > 0 && (
        <ul className="demo-users" aria-label="Demo customers">
          {demo.map(user => (
            <li key={`${user.tenant_id}/${user.user_id}`}>
              <button type="button" onClick={() => signInAs(user)}>
                {user.display_name}
              </button>
            </li>
          ))}
        </ul>
      )}
      <form
        onSubmit={event => {
          event.preventDefault();
          if (typed) onToken(typed);
        }}
      >
        <label htmlFor="token">Access token</label>
        <input id="token" type="password" autoComplete="off" value={typed} onChange={e => setTyped(e.target.value)} />
        <button type="submit">Sign in</button>
      </form>
    </main>
  );
}

// A confirmation: what would be done, to whom, and the two answers. The SDK sends the answer
// with its next request (sendAutomaticallyWhen), and Parley confirms or declines the action.
function Approval({ part, answer }) {
  const { summary, recipient_masked: recipient } = part.input ?? {};
  return (
    <section className="approval" aria-label="Confirmation needed">
      <p className="approval-summary">{summary}</p>
      {recipient && <p className="approval-recipient">To {recipient}</p>}
      <div className="approval-buttons">
        <button type="button" className="confirm" onClick={() => answer(part.approval.id, true)}>
          Confirm
        </button>
        <button type="button" className="decline" onClick={() => answer(part.approval.id, false)}>
          Decline
        </button>
      </div>
    </section>
  );
}

function ToolPart({ part, answer }) {
  if (part.state === 'approval-requested') return <Approval part={part} answer={answer} />;
  const done = {
    'output-available': 'done',
    'output-error': 'failed',
    'output-denied': 'declined',
    'approval-responded': part.approval?.approved ? 'confirmed' : 'declined',
  }[part.state];
  return (
    <p className="tool" data-state={part.state}>
      {part.title ?? part.toolName}
      {done ? ` (${done})` : '…'}
    </p>
  );
}

function Message({ message, answer, send }) {
  return (
    <li className={`msg msg-${message.role}`}>
      <span className="who">{message.role === 'user' ? 'You' : 'Assistant'}</span>
      {message.parts.map((part, i) => {
        if (part.type === 'text') return <p key={i} className="text">{part.text}</p>;
        if (part.type === 'dynamic-tool') return <ToolPart key={i} part={part} answer={answer} />;
        if (part.type === 'data-clarification') {
          return (
            <div key={i} className="options" role="group" aria-label={part.data.question}>
              {part.data.options.map(option => (
                <button key={option.value} type="button" onClick={() => send(option.label)}>
                  {option.label}
                </button>
              ))}
            </div>
          );
        }
        return null;
      })}
    </li>
  );
}

function Chat({ token, sessionId, history, reopened }) {
  const { messages, sendMessage, status, stop, addToolApprovalResponse, error } = useChat({
    id: sessionId,
    messages: history,
    // Opened again (a reload): follow the answer still running, if any (a replay of its turn).
    resume: reopened,
    transport: new DefaultChatTransport({
      api: '/v1/ai-sdk/chat',
      headers: { Authorization: `Bearer ${token}` },
      // Parley keeps the history and reads only the last message: send just that.
      prepareSendMessagesRequest: ({ id, messages, trigger, messageId }) => ({
        body: { id, messages: messages.slice(-1), trigger, messageId },
      }),
    }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  const [input, setInput] = useState('');
  const busy = status === 'submitted' || status === 'streaming';
  const send = text => sendMessage({ text });
  const answer = (id, approved) => addToolApprovalResponse({ id, approved });
  return (
    <main className="chat">
      <ol className="transcript" aria-label="Conversation">
        {messages.map(message => (
          <Message key={message.id} message={message} answer={answer} send={send} />
        ))}
      </ol>
      <p className="status" role="status">
        {error ? `Something went wrong: ${error.message}` : busy ? 'Answering…' : ''}
      </p>
      <form
        className="composer"
        onSubmit={event => {
          event.preventDefault();
          if (!input.trim() || busy) return;
          send(input);
          setInput('');
        }}
      >
        <label htmlFor="input" className="visually-hidden">Message</label>
        <input id="input" value={input} onChange={e => setInput(e.target.value)} placeholder="Ask about your order" />
        {busy ? (
          <button type="button" onClick={stop}>Stop</button>
        ) : (
          <button type="submit">Send</button>
        )}
      </form>
    </main>
  );
}

function App() {
  const [token, setToken] = useState(() => sessionStorage.getItem(TOKEN_KEY) ?? '');
  const [conversation, setConversation] = useState(null);
  const [failed, setFailed] = useState('');
  useEffect(() => {
    if (!token) return;
    openConversation(token).then(setConversation, e => setFailed(e.message));
  }, [token]);
  const signIn = value => {
    sessionStorage.setItem(TOKEN_KEY, value);
    setToken(value);
  };
  return (
    <>
      <header className="topbar">
        <h1>Northwind support, on useChat</h1>
      </header>
      {!token || failed ? (
        <>
          {failed && <p role="alert">{failed}</p>}
          <SignIn onToken={signIn} />
        </>
      ) : conversation ? (
        <Chat token={token} {...conversation} />
      ) : (
        <p role="status">Starting…</p>
      )}
    </>
  );
}

createRoot(document.getElementById('root')).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
