// The conversation list: titled by the first message, newest activity first, empty ones
// hidden (except the one open), each with a two-step delete.

import { el, relative } from './transcript.js';

const activity = (s) => s.last_activity_at || s.created_at;
// The conversation whose delete was pressed once: kept across re-renders of the list (a
// reply's arrival re-renders it), so the second press still deletes.
let armed = null;

export function renderSessions(sessions, openId, actions) {
  const list = document.getElementById('sessions');
  const active = document.activeElement;
  const focused = active && list.contains(active) ? active.closest('li')?.dataset.sid : null;
  const focusedPart = active?.classList.contains('session-delete')
    ? '.session-delete' : '.session-open';
  list.textContent = '';
  const shown = sessions
    .filter((s) => s.title || s.id === openId)
    .sort((a, b) => new Date(activity(b)) - new Date(activity(a)));
  if (!shown.length) list.append(el('li', 'sessions-empty', 'No conversations yet.'));
  for (const s of shown) {
    const li = el('li', s.id === openId ? 'session active' : 'session');
    li.dataset.sid = s.id;
    const open = el('button', 'session-open');
    open.type = 'button';
    if (s.id === openId) open.setAttribute('aria-current', 'true');
    open.append(el('span', 'session-title', s.title || 'New conversation'));
    const when = el('time', 'session-time', relative(activity(s)));
    when.dateTime = activity(s);
    open.append(when);
    open.addEventListener('click', () => actions.open(s.id));
    const remove = el('button', 'session-delete', '×');
    remove.type = 'button';
    remove.setAttribute('aria-label', 'Delete conversation: ' + (s.title || 'New conversation'));
    const arm = () => {
      remove.dataset.armed = 'true';
      remove.textContent = 'Delete?';
      remove.setAttribute('aria-label', 'Press again to delete: ' + (s.title || 'New conversation'));
    };
    if (armed === s.id) arm();
    remove.addEventListener('click', () => {
      if (remove.dataset.armed) {
        armed = null;
        return actions.remove(s.id);
      }
      armed = s.id;
      arm();
    });
    remove.addEventListener('blur', () => {
      if (!remove.isConnected) return; // replaced by a re-render, not left by the user
      armed = null;
      delete remove.dataset.armed;
      remove.textContent = '×';
    });
    li.append(open, remove);
    list.append(li);
  }
  if (focused) list.querySelector(`li[data-sid="${CSS.escape(focused)}"] ${focusedPart}`)?.focus();
}
