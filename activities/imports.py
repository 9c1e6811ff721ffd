"""An imported conversation's indexing (workflows/imports.py): its messages embedded for
recall by meaning, a batch a step, then the import marked done and the session's summary
asked for a pass (the same start a finished turn makes, `MemoryActivities.start_when_due`).

Full-text search finds imported messages from the moment they are stored (the `tsv` column is
generated); without an embedder, or without the `vector` extension, there is nothing more to
index and the first step finds the import done.
"""

from __future__ import annotations

import logging

from temporalio import activity

from parley.activities.memory import MemoryActivities
from parley.activities.recall import embed_pending
from parley.contracts import SummarizeInput
from parley.data_contracts import ImportInput
from parley.gateway.minilm import Embedder
from parley.statuses import ImportState
from parley.store import embeddings as embedding_store
from parley.store import imports
from parley.store.db import Database, connect

log = logging.getLogger(__name__)


class ImportActivities:
    def __init__(
        self, *, sessions: Database, memory: MemoryActivities, embedder: Embedder | None
    ) -> None:
        self._sessions = sessions
        self._memory = memory
        self._embedder = embedder

    @activity.defn(name="index_import")
    async def index_import(self, inp: ImportInput) -> int:
        """Embed one batch of the session's messages without a vector (the import's among
        them, oldest first) and record how many of the import's have one; returns how many
        still lack one (0: nothing left to do, or nothing this deployment can do)."""
        async with connect(self._sessions) as conn:
            row = await imports.import_of(conn, import_id=inp.import_id)
            vectors = self._embedder is not None and await embedding_store.available(conn)
        if row is None or row.status == ImportState.done:
            return 0  # erased with its session, or finished by an earlier run
        if not vectors or self._embedder is None:
            return 0  # full-text indexed them as they were stored
        embedded = await embed_pending(self._sessions, self._embedder, session_id=inp.session_id)
        async with connect(self._sessions) as conn:
            remaining = await imports.unembedded_count(conn, row=row, model=self._embedder.name)
            indexed = row.messages - remaining
            await imports.record_progress(conn, import_id=row.id, indexed=indexed, done=False)
        if remaining and not embedded:
            # Nothing left that the embedder takes (they were forgotten meanwhile): done.
            log.warning("import %s: %d messages left no embedder takes", row.id, remaining)
            return 0
        return remaining

    @activity.defn(name="finish_import")
    async def finish_import(self, inp: ImportInput) -> None:
        """Mark the import done, then ask the session's summary for a pass (it folds the
        imported history in when there is enough of it; a run under way takes one more)."""
        async with connect(self._sessions) as conn:
            row = await imports.import_of(conn, import_id=inp.import_id)
            if row is None:
                return  # erased with its session meanwhile
            indexed = row.messages
            if self._embedder is not None and await embedding_store.available(conn):
                remaining = await imports.unembedded_count(conn, row=row, model=self._embedder.name)
                indexed = row.messages - remaining
            await imports.record_progress(conn, import_id=row.id, indexed=indexed, done=True)
        await self._memory.start_when_due(SummarizeInput(inp.session_id, inp.import_id))
