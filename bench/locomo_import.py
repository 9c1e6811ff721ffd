"""(o) LoCoMo imported, and (p) import speed: issue 39's figures, through the public API.

(o) Each LoCoMo conversation (the ten upstream files, read from `--locomo-dir`; none is
committed) goes into a new session of a new user with no orders through
`POST /v1/sessions/{id}/import`, as a user bringing an earlier chat would bring it: the first
speaker's turns as `user`, the other's as `assistant`, each `Speaker: text` (with
`[photo: caption]` where a photo was shared, as section (e) stores it), each session's turns at
that session's date and time plus a second a turn. Once the import's status link says `done`
and the session's summary run has settled, every question of categories 1-4 whose evidence
turns were imported is asked in that session, one after another, and each turn's first model
call is read back as section (n) reads it: whether every evidence turn was shown, the
conversation context over the imported conversation's tokens (the footprint), the whole
prompt. The worker's CPU over the questions (psutil on its pid: the whole turn, recall among
it) is divided by the questions asked.

(p) 2,000 synthetic messages (varied sentences, a minute apart) imported into a fresh session
in one request: seconds to the 202 and to `done` (with the stack's embedder, if any, since
`done` waits for every vector), and the worker's CPU seconds meanwhile (what `done` would take
on a core of its own: on a loaded machine the wall time is mostly waiting for one), then the
same request again, which must answer 200 with the same import and store nothing.

Not in the default run (slow with embeddings on):

    .venv/bin/python -m bench --locomo-import-only [--locomo-import-convs 26,30]
    .venv/bin/python -m bench --locomo-import         # added to a full run
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import func, select
from temporalio.client import Client

from bench.locomo_api import CATEGORIES, ask, askable, posted_text
from bench.memory import photo_note
from bench.plain_summarizer import settled
from bench.prompt_figures import Question, footprint
from bench.stack import REPO, Stack, log
from parley.ids import import_workflow_id
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import Message, User
from parley.tokens import MESSAGE_OVERHEAD
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import eventually

# The ten conversations sit beside the worktrees on the bench machines (not committed).
DEFAULT_DIR = REPO.parent / "shared" / "data" / "locomo"
SESSION_KEY = re.compile(r"session_(\d+)")
SPEED_MESSAGES = 2000
TENANT = "northwind"  # the stack's seeded tenant, whose limits the stack lifts
# Waiting for `done`: the embedder takes a fraction of a second a message on a busy 2-core
# machine, so the wait grows with the import.
DONE_S_PER_MESSAGE = 1.0
DONE_MIN_S = 120.0


@dataclass(frozen=True)
class Dialogue:
    """One LoCoMo conversation as the bench imports it."""

    name: str  # the file's stem: its number
    speaker_a: str  # whose turns are the user's
    sessions: list[tuple[datetime, list[dict[str, Any]]]]  # (when it began, its turns)
    qa: list[dict[str, Any]]


def session_time(text: str) -> datetime:
    """LoCoMo's `1:56 pm on 8 May, 2023`, as UTC (the data names no zone)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def parse_dialogue(name: str, data: dict[str, Any]) -> Dialogue:
    """An upstream file: the conversation at its top level (locomo10_v2) or under
    `conversation` (locomo10.json's entries); sessions in their numbered order, those
    without turns left out."""
    conv = data.get("conversation", data)
    numbers = sorted(int(m.group(1)) for k in conv if (m := SESSION_KEY.fullmatch(k)))
    sessions = [
        (session_time(conv[f"session_{n}_date_time"]), list(conv[f"session_{n}"]))
        for n in numbers
        if conv[f"session_{n}"]
    ]
    return Dialogue(name, conv["speaker_a"], sessions, list(data["qa"]))


def load_dialogues(folder: Path, names: Sequence[str] | None) -> list[Dialogue]:
    """The conversations of `folder` (`NN.json`), all of them or those `names` picks."""
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no LoCoMo folder at {folder}: pass --locomo-dir with the upstream NN.json files"
        )
    paths = sorted(folder.glob("[0-9]*.json"))
    if names:
        paths = [folder / f"{n}.json" for n in names]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"LoCoMo conversations not found: {', '.join(missing)}")
    if not paths:
        raise FileNotFoundError(f"no LoCoMo conversation (NN.json) in {folder}")
    return [parse_dialogue(p.stem, json.loads(p.read_text())) for p in paths]


def import_items(dialogue: Dialogue) -> tuple[list[dict[str, Any]], list[str]]:
    """The import's items and, in the same order, each one's dia_id. A session's turns are a
    second apart from its start; a time is never earlier than the one before it (the route
    refuses that), should a session start before the previous one ended."""
    items: list[dict[str, Any]] = []
    dia_ids: list[str] = []
    previous: datetime | None = None
    for start, turns in dialogue.sessions:
        for offset, turn in enumerate(turns):
            moment = start + timedelta(seconds=offset)
            if previous is not None and moment < previous:
                moment = previous
            previous = moment
            role = "user" if turn["speaker"] == dialogue.speaker_a else "assistant"
            text = posted_text(turn) + photo_note(turn)
            items.append({"role": role, "text": text, "created_at": moment.isoformat()})
            dia_ids.append(turn["dia_id"])
    return items, dia_ids


def synthetic_items(count: int, *, seed: int = 39) -> list[dict[str, Any]]:
    """`count` varied messages, user and assistant in turn, a minute apart, ending a day ago."""
    rng = random.Random(seed)
    who = ["I", "My sister", "Our team", "The landlord", "A friend from work", "My neighbour"]
    did = ["booked", "cancelled", "repaired", "painted", "returned", "ordered", "planned"]
    what = [
        "a kayak",
        "the kitchen shelves",
        "two tickets to Lisbon",
        "a birthday cake",
        "the garden fence",
        "a used bicycle",
        "a pottery class",
        "winter tyres",
    ]
    when = ["last Tuesday", "in March", "yesterday", "after the storm", "before the exams"]
    start = datetime.now(UTC) - timedelta(days=1, minutes=count)
    items = []
    for n in range(count):
        sentence = (
            f"{rng.choice(who)} {rng.choice(did)} {rng.choice(what)} {rng.choice(when)}; "
            f"it cost {rng.randint(5, 900)} euros and took {rng.randint(1, 12)} hours (note {n})."
        )
        role = "user" if n % 2 == 0 else "assistant"
        moment = start + timedelta(minutes=n)
        items.append({"role": role, "text": sentence, "created_at": moment.isoformat()})
    return items


async def post_import(
    client: ParleyClient, sid: str, items: list[dict[str, Any]], key: str
) -> tuple[int, dict[str, Any]]:
    body = {"client_import_id": key, "items": items}
    answer = await client.http.post(f"/v1/sessions/{sid}/import", json=body, timeout=120)
    if answer.status_code not in (200, 202):
        raise RuntimeError(f"import into {sid}: {answer.status_code} {answer.text[:300]}")
    return answer.status_code, dict(answer.json())


async def until_done(client: ParleyClient, made: dict[str, Any]) -> dict[str, Any]:
    """Poll the import's status link until it says `done`."""

    async def probe() -> dict[str, Any] | None:
        answer = await client.http.get(made["status_url"])
        if answer.status_code != 200:
            raise RuntimeError(f"{made['status_url']}: {answer.status_code} {answer.text[:200]}")
        body = dict(answer.json())
        return body if body["status"] == "done" else None

    timeout = max(DONE_MIN_S, DONE_S_PER_MESSAGE * made["messages"])
    return await eventually(probe, timeout=timeout, what=f"import {made['id']} done", every=0.1)


async def imported_session(
    client: ParleyClient, temporal: Client, items: list[dict[str, Any]], limit: int
) -> tuple[str, list[int], list[dict[str, Any]]]:
    """A new session holding `items`, imported in requests of at most `limit`, each followed
    to `done`; then its summary run settled (the user comes back later). Returns the session,
    each item's seq and the imports as their status links last showed them."""
    sid = await client.new_session()
    key = uuid.uuid4().hex[:12]
    seqs: list[int] = []
    done: list[dict[str, Any]] = []
    for n, start in enumerate(range(0, len(items), limit)):
        chunk = items[start : start + limit]
        status, made = await post_import(client, sid, chunk, f"{key}-{n}")
        if status != 202 or made["messages"] != len(chunk):
            raise RuntimeError(f"import {n} into {sid}: {status}, {made['messages']} messages")
        seqs += range(made["first_seq"], made["first_seq"] + len(chunk))
        done.append(await until_done(client, made))
        # `done` is written before the summary is asked for: the workflow's end is after both.
        await temporal.get_workflow_handle(import_workflow_id(made["id"])).result()
    await settled(temporal, sid, [])
    return sid, seqs, done


async def imported_tokens(db_sessions: Database, sid: str, seqs: list[int]) -> int:
    """The imported messages' tokens as stored, with their framing (section (n)'s measure)."""
    async with orm(db_sessions) as db:
        tokens = await db.scalars(
            select(Message.token_count).where(
                Message.session_id == sid, Message.seq.between(min(seqs), max(seqs))
            )
        )
        return sum((t or 0) + MESSAGE_OVERHEAD for t in tokens)


async def fresh_user(db_sessions: Database, tenant_id: str) -> str:
    """A token of a new user of the demo tenant, one with no orders: for the bench's own user
    (a customer with orders), a question about "his studio" or "it" reads as a reference to
    one of them, and the resolver asks which order before any prompt is built."""
    user_id = f"bench_import_{uuid.uuid4().hex[:8]}"
    async with orm(db_sessions) as orm_db:
        orm_db.add(User(tenant_id=tenant_id, id=user_id, display_name="Importer"))
        await orm_db.commit()
    async with db_sessions() as db:
        token = await create_token(db, tenant_id=tenant_id, user_id=user_id)
        await db.commit()
    return token


def worker_cpu_s(stack: Stack) -> float | None:
    """The stack's worker's CPU seconds so far (user and system, its threads included)."""
    for child in stack.children:
        if child.name == "worker":
            times = psutil.Process(child.process.pid).cpu_times()
            return float(times.user + times.system)
    return None


def by_category(questions: list[Question]) -> dict[int, tuple[int, int]]:
    """Per LoCoMo category: (questions whose every evidence turn was shown, questions)."""
    counts: dict[int, tuple[int, int]] = {}
    for q in questions:
        found, asked = counts.get(q.category, (0, 0))
        counts[q.category] = (found + (q.evidence <= q.shown), asked + 1)
    return dict(sorted(counts.items()))


async def measure_dialogue(
    stack: Stack,
    client: ParleyClient,
    temporal: Client,
    db_sessions: Database,
    dialogue: Dialogue,
) -> dict[str, Any]:
    """One conversation imported, settled, then its questions asked: its figures."""
    items, dia_ids = import_items(dialogue)
    started = time.perf_counter()
    sid, seqs, imports = await imported_session(
        client, temporal, items, stack.settings.max_import_messages
    )
    ready_s = time.perf_counter() - started
    by_dia = dict(zip(dia_ids, seqs, strict=True))
    questions = askable({"qa": dialogue.qa}, by_dia)
    log(
        f"(o) {dialogue.name}: {len(items)} messages imported in {ready_s:.0f} s; asking "
        f"{len(questions)} questions"
    )
    cpu_before = worker_cpu_s(stack)
    asked = [await ask(client, db_sessions, sid, qa, by_dia) for qa in questions]
    cpu_after = worker_cpu_s(stack)
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return {
        "conversation": dialogue.name,
        "messages": len(items),
        "imports": len(imports),
        "indexed": sum(i["indexed"] for i in imports),
        "import_to_settled_s": round(ready_s, 1),
        "by_category": {str(c): list(v) for c, v in by_category(asked).items()},
        "worker_cpu_ms_per_question": cpu * 1000 / len(asked)
        if cpu is not None and asked
        else None,
        **footprint(asked, await imported_tokens(db_sessions, sid, seqs)),
    }


async def measure_locomo_import(
    stack: Stack,
    db_sessions: Database,
    *,
    folder: Path,
    names: Sequence[str] | None = None,
) -> dict[str, Any]:
    dialogues = load_dialogues(folder, names)
    temporal = await Client.connect(stack.settings.temporal_address)
    client = ParleyClient(stack.parley_url, await fresh_user(db_sessions, TENANT))
    try:
        rows = [await measure_dialogue(stack, client, temporal, db_sessions, d) for d in dialogues]
    finally:
        await client.aclose()
    return {"embeddings": stack.settings.embeddings or "off", "rows": rows, **overall(rows)}


def overall(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over the conversations and the lowest; each category over all of them."""
    recalls = [r["evidence_in_prompt"] for r in rows if r["questions"]]
    categories: dict[str, list[int]] = {}
    for row in rows:
        for category, (found, asked) in row["by_category"].items():
            total = categories.setdefault(category, [0, 0])
            total[0] += found
            total[1] += asked
    cpu = [r["worker_cpu_ms_per_question"] for r in rows if r["worker_cpu_ms_per_question"]]
    return {
        "mean_evidence_in_prompt": statistics.fmean(recalls) if recalls else float("nan"),
        "min_evidence_in_prompt": min(recalls, default=float("nan")),
        "by_category_all": dict(sorted(categories.items())),
        "mean_footprint": statistics.fmean(r["footprint"] for r in rows if r["questions"]),
        "mean_prompt_tokens": statistics.fmean(
            r["mean_prompt_tokens"] for r in rows if r["questions"]
        ),
        "worker_cpu_ms_per_question": statistics.fmean(cpu) if cpu else None,
    }


def _share(found_asked: Sequence[int]) -> str:
    found, asked = found_asked
    return f"{found / asked * 100:5.1f}%" if asked else "    -"


def render_locomo_import(r: dict[str, Any]) -> str:
    head = (
        f"{'conv':<6}{'msgs':>6}{'qs':>5}{'recall':>8}"
        + "".join(f"{'cat ' + str(c):>8}" for c in CATEGORIES)
        + f"{'footprint':>11}{'prompt tok':>12}{'cpu ms/q':>10}{'ready s':>9}"
    )
    lines = [
        "",
        "(o) LoCoMo imported through POST .../import, then every category 1-4 question asked "
        f"in the same session (embeddings: {r['embeddings']}; default budgets)",
        head,
    ]
    for row in r["rows"]:
        cats = "".join(f"{_share(row['by_category'].get(str(c), (0, 0))):>8}" for c in CATEGORIES)
        cpu = row["worker_cpu_ms_per_question"]
        lines.append(
            f"{row['conversation']:<6}{row['messages']:>6}{row['questions']:>5}"
            f"{row['evidence_in_prompt'] * 100:>7.1f}%{cats}{row['footprint'] * 100:>10.1f}%"
            f"{row['mean_prompt_tokens']:>12.0f}{cpu if cpu is not None else float('nan'):>10.0f}"
            f"{row['import_to_settled_s']:>9.0f}"
        )
    cats = "".join(f"{_share(r['by_category_all'].get(str(c), (0, 0))):>8}" for c in CATEGORIES)
    cpu_all = r["worker_cpu_ms_per_question"]
    two = r["by_category_all"].get("2", (0, 0))
    lines += [
        f"{'all':<6}{'':>6}{'':>5}{r['mean_evidence_in_prompt'] * 100:>7.1f}%{cats}"
        f"{r['mean_footprint'] * 100:>10.1f}%{r['mean_prompt_tokens']:>12.0f}"
        f"{cpu_all if cpu_all is not None else float('nan'):>10.0f}",
        f"  evidence in prompt: mean over {len(r['rows'])} conversations "
        f"{r['mean_evidence_in_prompt'] * 100:.1f}%, lowest "
        f"{r['min_evidence_in_prompt'] * 100:.1f}%; category 2 over all "
        f"{_share(two).strip()} ({two[0]} of {two[1]})",
        "  recall: every evidence turn shown; footprint: conversation context / the imported "
        "conversation's tokens; cpu ms/q: the worker's CPU over the questions / questions "
        "(the whole turn, recall among it); ready s: import to done and the summary settled",
    ]
    return "\n".join(lines)


async def session_messages(db_sessions: Database, sid: str) -> int:
    async with orm(db_sessions) as db:
        count = await db.scalar(select(func.count()).where(Message.session_id == sid))
        return int(count or 0)


async def measure_import_speed(
    stack: Stack, db_sessions: Database, *, messages: int = SPEED_MESSAGES
) -> dict[str, Any]:
    """`messages` synthetic messages in one request: seconds to 202 and to `done`; then the
    same request again, which must be the same import with nothing stored."""
    if messages > stack.settings.max_import_messages:
        raise ValueError(
            f"{messages} messages: the route takes at most "
            f"{stack.settings.max_import_messages} a request"
        )
    items = synthetic_items(messages)
    key = f"speed-{uuid.uuid4().hex[:8]}"
    client = ParleyClient(stack.parley_url, await fresh_user(db_sessions, TENANT))
    try:
        sid = await client.new_session()
        cpu_before = worker_cpu_s(stack)
        started = time.perf_counter()
        status, made = await post_import(client, sid, items, key)
        accepted_s = time.perf_counter() - started
        done = await until_done(client, made)
        done_s = time.perf_counter() - started
        cpu_after = worker_cpu_s(stack)
        stored = await session_messages(db_sessions, sid)
        again_status, again = await post_import(client, sid, items, key)
        stored_again = await session_messages(db_sessions, sid)
    finally:
        await client.aclose()
    return {
        "embeddings": stack.settings.embeddings or "off",
        "messages": messages,
        "status": status,
        "to_202_s": round(accepted_s, 2),
        "to_done_s": round(done_s, 2),
        # The worker's CPU from the request to `done` (the embedding, most of it): what the
        # wait would be on a core of its own, whatever else the machine runs.
        "worker_cpu_s": None
        if cpu_before is None or cpu_after is None
        else round(cpu_after - cpu_before, 1),
        "indexed": done["indexed"],
        "repeat_status": again_status,
        "repeat_same_import": again["id"] == made["id"],
        "messages_stored": stored,
        "messages_after_repeat": stored_again,
    }


def _seconds(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.1f} s"


def render_import_speed(r: dict[str, Any]) -> str:
    noop = (
        r["repeat_status"] == 200
        and r["repeat_same_import"]
        and r["messages_after_repeat"] == r["messages_stored"]
    )
    return "\n".join(
        [
            "",
            f"(p) Import speed: {r['messages']} synthetic messages in one request "
            f"(embeddings: {r['embeddings']})",
            f"  {r['status']} after {r['to_202_s']:.2f} s; done after {r['to_done_s']:.1f} s "
            f"(indexed: {r['indexed']} of {r['messages']}); the worker's CPU meanwhile "
            f"{_seconds(r.get('worker_cpu_s'))}",
            f"  the same request again: {r['repeat_status']}, "
            f"{'the same import' if r['repeat_same_import'] else 'ANOTHER import'}, messages "
            f"{r['messages_stored']} -> {r['messages_after_repeat']} "
            f"({'a no-op' if noop else 'NOT a no-op'})",
        ]
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--locomo-import",
        action="store_true",
        help="(o), (p) also LoCoMo imported through the API and the import speed (slow)",
    )
    parser.add_argument("--locomo-import-only", action="store_true", help="only (o) and (p)")
    parser.add_argument("--import-speed-only", action="store_true", help="only (p)")
    parser.add_argument(
        "--locomo-import-convs",
        type=lambda v: [n.strip() for n in v.split(",") if n.strip()],
        default=None,
        help="(o) which conversations, comma-separated file numbers (default: all in the folder)",
    )
    parser.add_argument(
        "--locomo-dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"(o) the upstream LoCoMo NN.json files (default {DEFAULT_DIR})",
    )
    parser.add_argument(
        "--import-speed-messages", type=int, default=SPEED_MESSAGES, help="(p) messages imported"
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a run of (o) without its data before any stack starts."""
    if (args.locomo_import or args.locomo_import_only) and not args.locomo_dir.is_dir():
        parser.error(
            f"--locomo-import needs the ten LoCoMo conversations: no folder {args.locomo_dir} "
            "(pass --locomo-dir with the upstream NN.json files)"
        )
