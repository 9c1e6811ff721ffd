// A minimal chat page on @ai-sdk/react's useChat against Parley's AI SDK endpoint
// (docs/features/ai-sdk.md). Nothing here knows Parley's own event vocabulary: the answer
// streams as the SDK's text parts, Parley's tools show as dynamic tool parts, a confirmation
// is the SDK's approval request, and a clarification's options are a data part.
//
// Built once into api/web/examples/use-chat.js (`make example-page`); `make run` serves it
// at /examples/use-chat. The bearer token is the chat page's (same tab), or one pasted here.

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

function Chat({ token, sessionId }) {
  const { messages, sendMessage, status, stop, addToolApprovalResponse, error } = useChat({
    id: sessionId,
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
  const [sessionId, setSessionId] = useState(null);
  const [failed, setFailed] = useState('');
  useEffect(() => {
    if (!token) return;
    newSession(token).then(setSessionId, e => setFailed(e.message));
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
      ) : sessionId ? (
        <Chat token={token} sessionId={sessionId} />
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
