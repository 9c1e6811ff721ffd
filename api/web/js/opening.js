// Opening a conversation rides out an API that cannot answer for a while (the network gone, a
// database restarting): its reads are made again (api.js `readPatiently`) until they answer or
// the tab opens another conversation, with the reason and the next try in the status line,
// which clears once they answer (unless something else has been said there since).

import { readPatiently } from './api.js';
import { $, S, status } from './state.js';

let notice = null; // { gen, text }: what the status line was told while opening `gen`

// A read of the opening `gen` (app.js `openSession`, state.js `S.openGen`).
export function openRead(path, gen) {
  return readPatiently(path, () => gen === S.openGen, (r, ms) => {
    const why = (r.error ? r.error.message : 'HTTP ' + r.status).replace(/\.$/, '');
    const text = 'Could not load this conversation (' + why + '). Trying again in ' + Math.ceil(ms / 1000) + ' s.';
    notice = { gen, text };
    status(text, 'error');
  });
}

// Both reads of the opening `gen` answered: its notice goes.
export function opened(gen) {
  if (notice && notice.gen === gen && $('status').textContent === notice.text) status('');
  notice = null;
}
