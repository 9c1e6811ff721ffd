"""The evaluator's side of the wire: Parley's session API (as one user), its admin routes
(as an operator) and, when there is one, the demo backend's inspection endpoints.

Nothing here reads a database: `parley eval` is a client of a running Parley like any other.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from parley.tls import httpx_verified

TERMINAL = frozenset({"done", "error", "cancelled"})
# The stream also closes when the turn rests on the user.
RESTING = frozenset({"confirmation_required", "interaction"})


class EvalClientError(Exception):
    """Parley (or the backend) answered something the evaluator cannot go on from."""


@dataclass
class Event:
    id: int | None
    type: str
    data: Any
    at: float  # monotonic seconds when it arrived


@dataclass
class Stream:
    events: list[Event] = field(default_factory=list)
    started: float = 0.0

    def first(self, kind: str) -> float | None:
        found = next((e.at for e in self.events if e.type == kind), None)
        return None if found is None else found - self.started

    @property
    def elapsed(self) -> float | None:
        return (self.events[-1].at - self.started) if self.events else None


async def _events(response: httpx.Response) -> AsyncIterator[Event]:
    event_id: int | None = None
    kind = "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield Event(event_id, kind, json.loads("\n".join(data)), time.monotonic())
            event_id, kind, data = None, "message", []
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                event_id = int(value)
            elif name == "event":
                kind = value
            elif name == "data":
                data.append(value)


def _checked(response: httpx.Response, *expected: int) -> Any:
    if response.status_code not in expected:
        raise EvalClientError(
            f"{response.request.method} {response.request.url.path}: "
            f"{response.status_code} {response.text[:300]}"
        )
    return response.json() if response.content else None


@dataclass
class Steered:
    """A message steered while its answer streamed: the turn that answered, its events."""

    turn_id: str
    stream: Stream
    taken: bool  # into the running answer; False: it was answered as a turn of its own


class UserClient:
    """One user's view of the session API."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            verify=httpx_verified(),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def new_session(self) -> str:
        return str(_checked(await self.http.post("/v1/sessions"), 201)["id"])

    async def say(
        self, session_id: str, text: str, seen_up_to: dict[str, int]
    ) -> tuple[str, Stream]:
        """Post a message and read its stream until it ends or rests. An answer to a waiting
        specialist continues the same turn: its stream is read after what was seen of it."""
        started = time.monotonic()
        turn_id = await self._post(session_id, text)
        after = seen_up_to.get(turn_id)
        return turn_id, await self.follow(session_id, turn_id, started=started, after=after)

    async def edit(self, session_id: str, message_id: str, text: str) -> tuple[str, Stream]:
        """A new version of an earlier message, and its turn's stream."""
        started = time.monotonic()
        body = {"client_message_id": uuid.uuid4().hex, "text": text}
        url = f"/v1/sessions/{session_id}/messages/{message_id}/edit"
        turn_id = str(_checked(await self.http.post(url, json=body), 202)["turn_id"])
        return turn_id, await self.follow(session_id, turn_id, started=started)

    async def regenerate(self, session_id: str, turn_id: str) -> tuple[str, Stream]:
        """An earlier turn's answer written again, and the new turn's stream."""
        started = time.monotonic()
        url = f"/v1/sessions/{session_id}/turns/{turn_id}/regenerate"
        again = str(_checked(await self.http.post(url), 202)["turn_id"])
        return again, await self.follow(session_id, again, started=started)

    async def switch(self, session_id: str, message_id: str, version: int) -> None:
        url = f"/v1/sessions/{session_id}/messages/{message_id}/versions/{version}"
        _checked(await self.http.post(url), 200)

    async def say_and_steer(self, session_id: str, text: str, steer: str) -> Steered:
        """Post a message, and once its answer streams its first words, `steer` with
        `"mode": "steer"`; read on until the answer that takes it ends. When the first
        answer ended before the steer came, the steer is a turn of its own, followed too."""
        started = time.monotonic()
        turn_id = await self._post(session_id, text)
        first = await self.follow(session_id, turn_id, started=started, until="delta")
        steered = await self._post(session_id, steer, mode="steer", full=True)
        last = first.events[-1].id if first.events else None
        if steered["turn_id"] == turn_id:
            rest = await self.follow(session_id, turn_id, started=started, after=last)
            first.events += rest.events
            return Steered(turn_id, first, bool(steered["steered"]))
        answer = await self.follow(session_id, str(steered["turn_id"]), started=started)
        return Steered(str(steered["turn_id"]), answer, False)

    async def _post(
        self, session_id: str, text: str, *, mode: str | None = None, full: bool = False
    ) -> Any:
        body = {"client_message_id": uuid.uuid4().hex, "text": text}
        if mode is not None:
            body["mode"] = mode
        url = f"/v1/sessions/{session_id}/messages"
        answer = _checked(await self.http.post(url, json=body), 202)
        return answer if full else str(answer["turn_id"])

    async def answer(self, session_id: str, action_id: str, verb: str) -> None:
        url = f"/v1/sessions/{session_id}/actions/{action_id}/{verb}"
        _checked(await self.http.post(url), 202)

    async def follow(
        self,
        session_id: str,
        turn_id: str,
        *,
        started: float,
        after: int | None = None,
        until: str | None = None,
    ) -> Stream:
        """The turn's events until it ends or rests (or, with `until`, one of that type)."""
        stream = Stream(started=started)
        headers = {"Last-Event-ID": str(after)} if after is not None else {}
        url = f"/v1/sessions/{session_id}/turns/{turn_id}/events"
        async with self.http.stream("GET", url, headers=headers) as response:
            if response.status_code != 200:
                raise EvalClientError(f"GET {url}: {response.status_code}")
            async for event in _events(response):
                stream.events.append(event)
                if event.type in TERMINAL or event.type in RESTING or event.type == until:
                    break
        return stream

    async def session(self, session_id: str) -> dict[str, Any]:
        return dict(_checked(await self.http.get(f"/v1/sessions/{session_id}"), 200))

    async def handoff(self, session_id: str) -> dict[str, Any] | None:
        """The session's latest case to a person; None if it never had one."""
        found = await self.http.get(f"/v1/sessions/{session_id}/handoff")
        if found.status_code == 404:
            return None
        return dict(_checked(found, 200))

    async def turn(self, session_id: str, turn_id: str) -> dict[str, Any]:
        return dict(
            _checked(await self.http.get(f"/v1/sessions/{session_id}/turns/{turn_id}"), 200)
        )

    async def messages(self, session_id: str, after_seq: int) -> list[dict[str, Any]]:
        url = f"/v1/sessions/{session_id}/messages"
        answer = _checked(await self.http.get(url, params={"after_seq": after_seq}), 200)
        return list(answer["messages"])


class AdminClient:
    """An operator of one tenant: its configuration, its sessions' tokens and traces."""

    def __init__(self, base_url: str, token: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            verify=httpx_verified(),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def config(self, tenant: str) -> dict[str, Any]:
        return dict(
            _checked(await self.http.get(f"/v1/admin/tenants/{tenant}/config"), 200)["config"]
        )

    async def put_config(self, tenant: str, config: dict[str, Any]) -> None:
        _checked(await self.http.put(f"/v1/admin/tenants/{tenant}/config", json=config), 200)

    async def feedback(self, tenant: str, *, limit: int) -> list[dict[str, Any]]:
        """The tenant's latest negative ratings, newest first."""
        url = f"/v1/admin/tenants/{tenant}/feedback"
        return list(_checked(await self.http.get(url, params={"limit": limit}), 200)["feedback"])

    async def session_runs(self, tenant: str, session_id: str) -> list[dict[str, Any]]:
        """The session's turns, each with its model tokens and its trace spans."""
        url = f"/v1/admin/tenants/{tenant}/sessions/{session_id}/runs"
        return list(_checked(await self.http.get(url), 200)["turns"])

    async def session_costs(self, tenant: str, start: str, end: str) -> dict[str, str]:
        """What each of the tenant's sessions cost in the UTC days `start`..`end`, from the
        ledger (USD as decimal strings, by session id)."""
        url = f"/v1/admin/tenants/{tenant}/costs"
        params = {"from": start, "to": end, "by": "session"}
        lines = _checked(await self.http.get(url, params=params), 200)["lines"]
        return {str(line["name"]): str(line["cost_usd"]) for line in lines}


class BackendClient:
    """The Northwind demo backend: its clock, its fault knobs and the emails it accepted."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=10, verify=httpx_verified())

    async def aclose(self) -> None:
        await self.http.aclose()

    async def reachable(self) -> bool:
        try:
            return (await self.http.get("/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def emails(self) -> list[dict[str, Any]]:
        return list(_checked(await self.http.get("/emails"), 200)["emails"])

    async def today(self) -> str:
        return str(_checked(await self.http.get("/clock"), 200)["today"])

    async def set_state(self, *, today: str | None, faults: dict[str, Any] | None) -> None:
        if today is not None:
            _checked(await self.http.put("/clock", json={"today": today}), 200)
        if faults is not None:
            _checked(await self.http.post("/faults", json=faults), 200)

    async def set_carrier_note(self, tenant: str, order_id: str, note: str | None) -> None:
        url = f"/admin/tenants/{tenant}/orders/{order_id}/carrier-note"
        _checked(await self.http.put(url, json={"note": note}), 200)

    async def reset(self, today: str) -> None:
        _checked(await self.http.delete("/faults"), 200)
        _checked(await self.http.put("/clock", json={"today": today}), 200)
