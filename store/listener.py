"""The event log's doorbell, heard: one LISTEN connection relaying every notification on
`NOTIFY_CHANNEL` (store/events.py rings it at each commit that appended events).

The API's `EventHub` owns the reconnect loop and what a notification wakes; this module owns
the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg

from parley.store.events import NOTIFY_CHANNEL


async def listen_for_events(
    conninfo: str, *, on_listening: Callable[[int], None], on_payload: Callable[[str], None]
) -> None:
    """Connect, LISTEN, call `on_listening` with the connection's server pid, then call
    `on_payload` with every notification's payload until the connection fails (raises; the
    caller reconnects) or the task is cancelled."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        on_listening(conn.info.backend_pid)
        await _relay(conn, on_payload)


async def _relay(conn: psycopg.AsyncConnection[Any], on_payload: Callable[[str], None]) -> None:
    """One reader stays on the socket for the connection's life and takes every notification
    a read brings (psycopg's `notifies()` adds and removes a reader, and runs a generator,
    for each)."""
    loop = asyncio.get_running_loop()
    pgconn, encoding = conn.pgconn, conn.info.encoding
    lost: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            pgconn.consume_input()  # raises once the server has closed the connection
            while (note := pgconn.notifies()) is not None:
                on_payload(note.extra.decode(encoding))
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listener's connection is closed")
        except Exception as exc:
            if not lost.done():
                lost.set_exception(exc)

    socket = pgconn.socket
    loop.add_reader(socket, readable)
    try:
        readable()  # what arrived with the LISTEN's answer
        await lost
    finally:
        loop.remove_reader(socket)
