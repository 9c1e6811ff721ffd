"""Server-sent events read straight off a streaming HTTP body, for the adapters' hot path.

The provider SDKs build a typed model object for every chunk they stream (a few hundred
per answer, one per token); at tens of tokens a second per stream and many streams per
worker that construction was most of a worker's CPU. The adapters that read the wire
themselves (gateway/openai_compat.py) take the events' data here instead: each event's
`data:` lines, joined, as bytes for `json.loads`, with no object built on the way.

What is kept of the format (the WHATWG event-stream rules the SDKs follow): lines end with
LF, CRLF or a lone CR, even when the network cuts a CRLF in two; an empty line ends an event;
a `data:` field's value loses one leading space and several join with LF; other fields (event,
id, retry) and comments are not needed by a chat completion stream and are skipped; an event
left unfinished when the body ends is dropped. Bytes are only decoded by the caller's
`json.loads` of a whole event, so a multi-byte character cut by the network is whole again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator


async def event_data(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The data of each event in `body`, as the events complete."""
    pending = b""  # the start of a line whose end has not come yet
    data: list[bytes] = []
    async for chunk in body:
        text = pending + chunk if pending else chunk
        if b"\r" in text:
            # A CR at the very end may be the first half of a CRLF: it waits for the next
            # chunk, so the pair is one line end and not two (which would end the event).
            held = text.endswith(b"\r")
            if held:
                text = text[:-1]
            text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                text += b"\r"
        lines = text.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line:
                if data:
                    yield data[0] if len(data) == 1 else b"\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
