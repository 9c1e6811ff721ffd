// Signing in: a demo user's button (`make run`'s users, from /web/config) or a pasted token.
// app.js shows the form when there is no token and enters the app once one is accepted.

import { auth, errorText, request, tryToken } from './api.js';
import { $, S } from './state.js';
import * as T from './transcript.js';

let enter = () => {};

// `enterApp`: what follows an accepted sign-in.
export function initSignIn(enterApp) {
  enter = enterApp;
  $('token-form').addEventListener('submit', signInWithToken);
}

export function showSignIn(message) {
  $('app').hidden = true;
  $('sign-out').hidden = true;
  $('menu').hidden = true;
  $('whoami').textContent = '';
  $('signin').hidden = false;
  $('signin-error').textContent = message || '';
  const list = $('demo-users');
  list.textContent = '';
  for (const u of S.demoUsers) {
    const b = T.el('button', 'demo-user');
    b.type = 'button';
    b.dataset.userId = u.user_id;
    b.append(T.el('span', 'demo-name', u.display_name), T.el('span', 'demo-tenant', u.tenant_id));
    b.addEventListener('click', () => signInAs(u));
    const li = T.el('li');
    li.append(b);
    list.append(li);
  }
  $('demo-signin').hidden = S.demoUsers.length === 0;
  (list.querySelector('button') || $('token')).focus();
}

async function signInAs(u) {
  const r = await request('POST', '/dev/sign-in/' + encodeURIComponent(u.tenant_id) + '/' + encodeURIComponent(u.user_id));
  if (!r.ok) {
    $('signin-error').textContent = errorText(r);
    return;
  }
  auth.save(r.data.token, r.data.user.display_name);
  enter();
}

async function signInWithToken(event) {
  event.preventDefault();
  const token = $('token').value.trim();
  if (!token) return;
  const r = await tryToken(token, '/v1/sessions', $('signin-error'), (r) => (r.status === 401
    ? 'That token was not accepted. Check it and try again.' : null));
  if (!r.ok) return;
  $('token').value = '';
  enter();
}
