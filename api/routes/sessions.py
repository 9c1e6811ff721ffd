"""Sessions and their message history."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from fastapi import APIRouter, Query, Response

from parley.api.branch_schemas import MessageList
from parley.api.delivery import start_erasure_soon
from parley.api.deps import AppSettings, CurrentUser, DbSession, Sessions, Temporal
from parley.api.errors import answers
from parley.api.live import cursor_now
from parley.api.schemas import ForgottenOut, SessionDetail, SessionList, SessionOut
from parley.dispatch.control import cancel_turn_workflow
from parley.dispatch.summaries import ask_for_summary
from parley.erasure import ErasureInput
from parley.errors import NotFound, RateLimited, TurnFinished, TurnInProgress
from parley.store import actions, branches, files, queue, slots
from parley.store import sessions as store_sessions
from parley.store.lifecycle import erasure, eval_drafts, forget
from parley.wire import ElsewhereView, VersionsView

log = logging.getLogger(__name__)

# How long a delete waits on Temporal to cancel the session's running turn.
CANCEL_TIMEOUT_S = 5.0
# Seqs are 32-bit in the store; a larger `after_seq` is a 422, not a database error.
MAX_SEQ = 2**31 - 1

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], responses=answers())


@router.post("", status_code=201, responses=answers(RateLimited))
async def create_session(db: DbSession, user: CurrentUser, settings: AppSettings) -> SessionOut:
    """Start a new, empty conversation."""
    per_day = settings.max_sessions_per_user_per_day
    session = await store_sessions.create_session(db, owner=user, per_day=per_day)
    await db.commit()
    return SessionOut.from_row(session)


@router.get("")
async def list_sessions(db: DbSession, user: CurrentUser) -> SessionList:
    """List the caller's own sessions, newest first, each titled by its first message."""
    summaries = await store_sessions.list_sessions(db, owner=user)
    return SessionList(sessions=[SessionOut.from_row(s) for s in summaries])


@router.get("/{session_id}", responses=answers(NotFound))
async def get_session(
    session_id: str, db: DbSession, user: CurrentUser, settings: AppSettings
) -> SessionDetail:
    """One session with its active turn, pending action and slots (for resume after reload)."""
    session = await store_sessions.get_session(db, owner=user, session_id=session_id)
    active = (
        await store_sessions.get_turn(
            db, owner=user, session_id=session_id, turn_id=session.active_turn_id
        )
        if session.active_turn_id
        else None
    )
    pending = await actions.pending_action(db, session_id=session_id)
    current = await slots.get_slots(db, session_id=session_id)
    waiting = await queue.queued_message(db, queued_turn_id=session.queued_turn_id)
    return SessionDetail.build(
        session, active=active, pending=pending, slots=current, settings=settings, queued=waiting
    )


@router.delete("/{session_id}", status_code=204, responses=answers(NotFound))
async def delete_session(
    session_id: str,
    db: DbSession,
    sessions: Sessions,
    user: CurrentUser,
    temporal: Temporal,
    settings: AppSettings,
) -> Response:
    """Delete the session for its owner; a turn still running in it is cancelled, a message
    queued behind it dropped, and after a short grace period the session and everything made
    from it are erased."""
    await queue.drop_queued(db, owner=user, session_id=session_id)  # it must not start
    active_turn_id = await store_sessions.delete_session(db, owner=user, session_id=session_id)
    await files.delete_session_files(db, session_id=session_id)  # uploads go with it
    grace = settings.session_erase_grace_s
    owner = {"tenant_id": user.tenant_id, "user_id": user.user_id}
    request = await erasure.request_erasure(
        db, key=settings.erasure_receipt_key, **owner, session_id=session_id, grace_s=grace
    )
    await db.commit()
    await start_erasure_soon(temporal, sessions, settings, ErasureInput(request.id, grace_s=grace))
    if active_turn_id is not None:
        try:
            client = await asyncio.wait_for(temporal.get(), CANCEL_TIMEOUT_S)
            await asyncio.wait_for(
                cancel_turn_workflow(client, sessions, turn_id=active_turn_id), CANCEL_TIMEOUT_S
            )
        except TurnFinished:
            pass  # it ended on its own meanwhile
        except Exception:
            # The session is gone for its owner either way; the turn then ends by its own
            # bounds (a waiting confirmation expires).
            log.exception("could not cancel turn %s of deleted session", active_turn_id)
    return Response(status_code=204)


@router.get("/{session_id}/messages", responses=answers(NotFound))
async def list_messages(
    session_id: str,
    db: DbSession,
    user: CurrentUser,
    after_seq: int = Query(0, ge=0, le=MAX_SEQ),
    limit: int = Query(100, ge=1, le=500),
) -> MessageList:
    """The conversation shown (its active branch's path): messages after `after_seq`, in seq
    order, each edited or regenerated one with its `versions`; `elsewhere`: actions done on
    other versions of it; `cursor`: the session stream's `Last-Event-ID` to take up from this
    read."""
    # One snapshot for the messages and the cursor: what commits between two statements is in
    # both or neither. The sign-in's reads before it are done with.
    await db.rollback()
    await db.repeatable_read()
    messages = await store_sessions.list_messages(
        db, owner=user, session_id=session_id, after_seq=after_seq, limit=limit
    )
    found, elsewhere = await branches.versions(db, session_id=session_id, messages=messages)
    shown = [
        m.model_copy(update={"versions": VersionsView(count=v.count, shown=v.shown)})
        if (v := found.get(m.id))
        else m
        for m in messages
    ]
    cursor = await cursor_now(db, session_id=session_id)
    return MessageList(
        messages=shown,
        elsewhere=[ElsewhereView.model_validate(vars(e)) for e in elsewhere],
        cursor=str(cursor),
    )


@router.delete("/{session_id}/messages/{message_id}", responses=answers(NotFound, TurnInProgress))
async def forget_message(
    session_id: str,
    message_id: str,
    db: DbSession,
    user: CurrentUser,
    temporal: Temporal,
    settings: AppSettings,
) -> ForgottenOut:
    """Forget one message and every copy of it (a user message goes with its answer)."""
    withdrawn = await forget.forget_message(
        db, owner=user, session_id=session_id, message_id=message_id
    )
    await db.commit()
    # A draft captured in the session copies what the user said there, up to its rating.
    drafts = eval_drafts.drafts_of_session(
        settings.eval_capture_dir,
        tenant_id=user.tenant_id,
        user_id=user.user_id,
        session_id=session_id,
    )
    removed = replace(withdrawn.removed, eval_drafts=eval_drafts.remove(drafts))
    asked = False
    for session in withdrawn.sessions_to_summarize:
        try:  # the next turn's summary run rewrites it as well, should this not reach it
            client = await asyncio.wait_for(temporal.get(), CANCEL_TIMEOUT_S)
            await asyncio.wait_for(
                ask_for_summary(
                    client, session_id=session, after=message_id, task_queue=settings.task_queue
                ),
                CANCEL_TIMEOUT_S,
            )
            asked = True
        except Exception:
            log.exception("could not ask for the summary of session %s", session)
    return ForgottenOut(
        message_id=message_id,
        message_ids=withdrawn.message_ids,
        removed=removed,
        summary_rewriting=asked,
    )
