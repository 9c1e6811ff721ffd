"""Erasing a user removes the eval drafts `parley eval capture --feedback` made from their
ratings (copies of their text) and names them on the receipt; another user's draft stays.
A deleted session's erasure removes the drafts captured in it, and forgetting a message
removes the drafts captured in its session."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client

from parley.config import Settings
from parley.dispatch.erasure import start_erasure
from parley.erasure import ErasureInput
from parley.eval.capture import capture_feedback
from parley.store.db import Database
from parley.store.lifecycle import erasure
from tests.support.client import ParleyClient
from tests.support.erasure import add_user, done_turn, new_customers, receipt
from tests.support.evals import eval_target
from tests.support.toolkit import eventually

Sessions = Database


async def rate_down(client: ParleyClient, text: str, sid: str | None = None) -> str:
    """A turn (in a new session unless `sid`) and a negative rating of its answer; the
    draft's name once captured."""
    sid = sid or await client.new_session()
    await done_turn(client, sid, text)
    [*_, answer] = (await client.http.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
    assert answer["role"] == "assistant"
    url = f"/v1/sessions/{sid}/messages/{answer['id']}/feedback"
    rated = await client.http.post(url, json={"rating": "down", "comment": "not helpful"})
    assert rated.status_code == 201, rated.text
    return f"feedback-{answer['id']}.yaml"


async def capture(
    api_url: str, sessions: Sessions, admin: str, drafts: list[Path], scratch: Path
) -> None:
    """Capture the tenant's ratings into `scratch`, then move only these drafts into the
    shared capture folder (other tests' users' drafts would land on their receipts)."""
    target = eval_target(api_url, sessions, None)

    async def captured() -> list[Path] | None:
        await capture_feedback(
            url=api_url,
            admin_token=admin,
            tenant="northwind",
            token_for=target.token_for,
            out=scratch,
        )
        return drafts if all((scratch / d.name).exists() for d in drafts) else None

    await eventually(captured, timeout=20, what="the drafts of the ratings")
    for draft in drafts:
        (scratch / draft.name).rename(draft)


async def test_erasing_a_user_removes_their_captured_drafts_and_counts_them(
    api_url: str,
    settings: Settings,
    sessions: Sessions,
    tokens: dict[str, str],
    tmp_path: Path,
) -> None:
    erased, kept = new_customers(2)
    gone = ParleyClient(api_url, await add_user(sessions, erased))
    stays = ParleyClient(api_url, await add_user(sessions, kept))
    folder = settings.eval_capture_dir
    try:
        drafts = [
            folder / await rate_down(gone, f"Hello, my reference is {erased.canaries['msg']}."),
            folder / await rate_down(stays, f"Hello, my reference is {kept.canaries['msg']}."),
        ]
        await capture(api_url, sessions, tokens["admin"], drafts, tmp_path)
        assert erased.canaries["msg"] in drafts[0].read_text()
        started = await gone.http.delete("/v1/me")
        assert started.status_code == 202, started.text
        done = await receipt(gone, started.json()["status_url"], timeout=60)
    finally:
        await gone.aclose()
        await stays.aclose()
    assert not drafts[0].exists(), "the erased user's draft is still there"
    assert done["counts"]["eval_drafts"] == 1
    assert done["total"] == sum(done["counts"].values())
    assert kept.canaries["msg"] in drafts[1].read_text()
    leftovers = [p.name for p in folder.iterdir() if erased.canaries["msg"] in _text(p)]
    assert leftovers == [] and not list(folder.glob(".erasing-*"))


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


async def test_forgetting_a_message_removes_the_drafts_captured_in_its_session(
    api_url: str, settings: Settings, sessions: Sessions, tokens: dict[str, str], tmp_path: Path
) -> None:
    [who] = new_customers(1)
    client = ParleyClient(api_url, await add_user(sessions, who))
    folder = settings.eval_capture_dir
    try:
        sid = await client.new_session()
        said = f"Hello, my reference is {who.canaries['msg']}."
        here = folder / await rate_down(client, said, sid)
        elsewhere = folder / await rate_down(client, "Hello again.")
        await capture(api_url, sessions, tokens["admin"], [here, elsewhere], tmp_path)
        [question, *_] = (await client.http.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        assert question["role"] == "user" and question["text"] == said
        forgotten = await client.http.delete(f"/v1/sessions/{sid}/messages/{question['id']}")
        assert forgotten.status_code == 200, forgotten.text
    finally:
        await client.aclose()
    assert forgotten.json()["removed"]["eval_drafts"] == 1
    assert not here.exists() and elsewhere.exists()


async def test_erasing_a_session_removes_only_the_drafts_captured_in_it(
    api_url: str,
    settings: Settings,
    sessions: Sessions,
    tokens: dict[str, str],
    temporal_client: Client,
    tmp_path: Path,
) -> None:
    [who] = new_customers(1)
    client = ParleyClient(api_url, await add_user(sessions, who))
    folder = settings.eval_capture_dir
    try:
        sid = await client.new_session()
        here = folder / await rate_down(client, f"Hello, I am {who.canaries['nick']}.", sid)
        elsewhere = folder / await rate_down(client, "Hello again.")
        await capture(api_url, sessions, tokens["admin"], [here, elsewhere], tmp_path)
        # The session's erasure as its delete starts it, without the grace period's wait.
        async with sessions.begin() as db:
            row = await erasure.request_erasure(
                db,
                key=settings.erasure_receipt_key,
                tenant_id="northwind",
                user_id=who.user_id,
                session_id=sid,
            )
        inp = ErasureInput(erasure_id=row.id)
        await start_erasure(temporal_client, sessions, inp, task_queue=settings.task_queue)
        done = await receipt(client, f"/v1/erasures/{row.id}", timeout=60)
    finally:
        await client.aclose()
    assert done["scope"] == "session" and done["counts"]["eval_drafts"] == 1
    assert not here.exists() and elsewhere.exists()
