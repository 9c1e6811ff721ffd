// The session API as the page uses it: the bearer token (kept for this tab only) and a JSON
// request helper that never throws.

const TOKEN_KEY = 'parley_token';
const NAME_KEY = 'parley_user';

export const auth = {
  // sessionStorage: the token lives as long as the tab, and no other tab or later visit sees it.
  get token() { return sessionStorage.getItem(TOKEN_KEY) || ''; },
  get name() { return sessionStorage.getItem(NAME_KEY) || ''; },
  save(token, name) {
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(NAME_KEY, name || '');
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(NAME_KEY);
  },
};

// Answers {ok, status, data, error, retryAfter}; status 0 means the network failed.
export async function request(method, path, body) {
  const headers = {};
  if (auth.token) headers.Authorization = 'Bearer ' + auth.token;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    return { ok: false, status: 0, data: null, error: { code: 'network', message: 'The network is unreachable; check your connection.' } };
  }
  const data = await res.json().catch(() => null); // empty or non-JSON body -> null
  return {
    ok: res.ok, status: res.status, data,
    error: data && data.error, retryAfter: res.headers.get('Retry-After'),
  };
}

// A read whose failure may pass (the network, a dependency away: status 0, 429, 502-504) is
// made again after a pause, growing to 15 s (longer if Retry-After says so, up to a minute),
// for as long as `wanted()` holds; `waiting(r, ms)` hears of each pause. Any other answer
// comes back as it is.
const AGAIN_MS = [500, 1000, 2000, 4000, 8000, 15000];
const MAX_WAIT_MS = 60000;
const PASSING = new Set([0, 429, 502, 503, 504]);

export async function readPatiently(path, wanted, waiting) {
  for (let tries = 0; ; tries += 1) {
    const r = await request('GET', path);
    if (r.ok || !PASSING.has(r.status) || !wanted()) return r;
    const asked = Math.min(1000 * (Number(r.retryAfter) || 0), MAX_WAIT_MS);
    const ms = Math.max(AGAIN_MS[Math.min(tries, AGAIN_MS.length - 1)], asked);
    waiting(r, ms);
    await new Promise((done) => setTimeout(done, ms));
    if (!wanted()) return r;
  }
}

export function errorText(r) {
  if (r.status === 401) return 'Your sign-in is no longer valid. Please sign in again.';
  let text = r.error ? r.error.message : 'Something went wrong (HTTP ' + r.status + ').';
  if (r.retryAfter) text += ' Try again in ' + r.retryAfter + ' s.';
  return text;
}

// A pasted token tried on `path`: kept if the API answers, forgotten if not, with the reason
// in `errorBox` (`refusal(r)`: the words for a refusal this page expects, or null).
export async function tryToken(token, path, errorBox, refusal) {
  auth.save(token, '');
  const r = await request('GET', path);
  if (!r.ok) {
    auth.clear();
    errorBox.textContent = refusal(r) || errorText(r);
  }
  return r;
}

export const sessionPath = (sid, ...rest) =>
  '/v1/sessions/' + [sid, ...rest].map(encodeURIComponent).join('/');
