// A turn's events as the page draws them (api.md, the event stream): the status line, the
// streaming answer, tool chips, the card, options, follow-ups, citations, files, and the
// terminal event. Drawn once each, whichever stream brought it (app.js `draw`).

import { removeConfirm, warnConfirm } from './confirm.js';
import { expireCard, showCard } from './cards.js';
import { $, PROGRESS, RESOLVED, S, status } from './state.js';
import * as T from './transcript.js';

// How a specialist named in a `subagent` event is introduced.
const SPECIALISTS = { returns: 'Returns specialist' };

// `send(text, interactionValue)`, `fetchFile(fileId)`: app.js's.
let hooks = { send: () => {}, fetchFile: async () => null };

export function initTurnEvents(given) { hooks = given; }

// Draw one event of `turnId`; true for a terminal one.
export function onEvent(turnId, type, d, fromScratch) {
  switch (type) {
    case 'state':
      if (PROGRESS[d.state]) status(PROGRESS[d.state], 'progress');
      return false;
    case 'delta': {
      T.appendDelta(d.message_id, d.text, turnId, fromScratch, S.replacing);
      S.replacing = null;
      return false;
    }
    case 'reset': T.resetMessage(d.message_id); return false;
    case 'steered':
      if (d.superseded_message_id) T.supersede(d.superseded_message_id);
      status('Taking your new message into account…', 'progress');
      return false;
    case 'tool': T.toolChip(turnId, d); return false;
    case 'warning': T.notice(d.message, 'warning'); return false;
    case 'confirmation_required':
      T.endStreaming(); // the proposal's words are whole; only the card waits
      status('');
      showCard(d.action);
      return false;
    case 'confirmation_expiring': warnConfirm(d.action); return false;
    case 'confirmation_resolved':
      if (document.getElementById('confirm-card')?.dataset.actionId === d.action.id) {
        // An expired card stays, offering to ask again; any other answer takes it away.
        if (d.action.status === 'expired') expireCard();
        else removeConfirm();
      }
      T.notice((RESOLVED[d.action.status] || 'You confirmed: ') + d.action.summary);
      return false;
    case 'clarification':
      S.options = T.options(turnId, d, (o) => hooks.send(o.value));
      return false;
    case 'interaction':
      S.options = T.options(turnId, d, (o) => hooks.send(o.label, o.value));
      return false;
    case 'retracted': T.retract(d.message_id, d.replacement_text); return false;
    case 'followups': drawFollowups(d.suggestions || []); return false;
    case 'citations': T.citations(d); return false;
    case 'artifact': T.artifact(turnId, d, hooks.fetchFile); return false;
    case 'subagent':
      if (d.phase === 'start') T.notice((SPECIALISTS[d.name] || d.name) + ' is helping with this.', 'info');
      return false;
    case 'done':
    case 'cancelled':
      T.showMessage(d.message);
      T.attachArtifacts(turnId, d.message.id);
      S.lastSeq = Math.max(S.lastSeq, d.message.seq || 0);
      status(type === 'cancelled' ? 'You stopped this answer.' : '');
      return true;
    case 'error':
      status(d.message, 'error');
      return true;
    default:
      return false;
  }
}

function drawFollowups(suggestions) {
  const box = $('followups');
  box.textContent = '';
  for (const text of suggestions) {
    const chip = T.el('button', 'chip', text);
    chip.type = 'button';
    chip.addEventListener('click', () => hooks.send(text));
    box.append(chip);
  }
}
