"""Tool-call reassembly does not depend on where the network cuts the bytes.

A recorded tool-call stream (built by the fake provider's SSE encoders, exactly as each
provider sends it) is split at every byte boundary, and at random sets of boundaries, and
fed through the real SDK client (SSE decoding) and the adapter (fragment assembly) by an
`httpx2.MockTransport` whose streaming body yields the chosen chunks. The result must be the
same single `ToolCallRequest` every time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parley.gateway.anthropic import AnthropicProvider
from parley.gateway.base import Finish, ModelProvider, ModelRequest, TextDelta, ToolCallRequest
from parley.gateway.errors import ProviderFatal, ProviderRetryable
from parley.gateway.fake_provider.server import Frame, Reply, ToolCall, anthropic_sse, openai_sse
from parley.gateway.openai_compat import OpenAICompatProvider

# JSON text with a key to cut, escaped quotes and backslashes, `\uXXXX` escapes (one a
# surrogate pair), and raw multi-byte UTF-8 (2, 3 and 4 bytes).
ARGS = (
    '{"order_id":"NW-1001","note":"say \\"hi\\" \\\\ caf\\u00e9 '
    'café 東京 😀 \\ud83d\\ude00","n":[1,2.5,null,true]}'
)
assert json.loads(ARGS)["note"] == 'say "hi" \\ café café 東京 😀 😀'


def _cut(text: str, *marks: str) -> list[str]:
    """Split `text` just after each mark (found in order)."""
    pieces, start = [], 0
    for mark in marks:
        end = text.index(mark, start) + len(mark)
        pieces.append(text[start:end])
        start = end
    return [*pieces, text[start:]]


# Fragments cut mid-key, mid-escape (after a lone backslash), inside `\u00e9`, between the
# two halves of an escaped surrogate pair.
PIECES = _cut(ARGS, '{"ord', "say \\", "\\u00", "\\ud83d")
assert "".join(PIECES) == ARGS
REPLY = Reply(
    text=["Checking ☕ "],
    tool_calls=[ToolCall(id="call_7", name="get_order", arguments=ARGS, pieces=PIECES)],
    input_tokens=40,
    output_tokens=12,
    cached_tokens=8,
)
EXPECTED = [
    TextDelta("Checking ☕ "),
    ToolCallRequest("call_7", "get_order", ARGS),
    Finish("tool_calls", {"input_tokens": 40, "output_tokens": 12, "cached_tokens": 8}),
]
REQUEST = ModelRequest("fake-model", [{"role": "user", "content": "Where is NW-1001?"}])

Encoder = Callable[[Reply], list[Frame]]
DIALECTS: dict[str, Encoder] = {
    "openai": lambda reply: openai_sse(reply),
    "anthropic": lambda reply: anthropic_sse(reply),
}


class Wire:
    """A provider whose HTTP responses are the given chunks of bytes, as a stream."""

    def __init__(self, dialect: str) -> None:
        self.chunks: list[bytes] = []
        client = httpx2.AsyncClient(transport=httpx2.MockTransport(self._respond))
        self.provider: ModelProvider
        if dialect == "openai":
            self.provider = OpenAICompatProvider(
                base_url="http://fake/v1", api_key="k", http_client=client
            )
        else:
            self.provider = AnthropicProvider(
                base_url="http://fake", api_key="k", http_client=client
            )

    async def _respond(self, request: httpx2.Request) -> httpx2.Response:
        chunks = list(self.chunks)

        async def body() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    async def events(self, chunks: list[bytes]) -> list[Any]:
        self.chunks = chunks
        return [event async for event in self.provider.stream(REQUEST)]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def stream_bytes(dialect: str, reply: Reply = REPLY) -> bytes:
    return b"".join(frame.data for frame in DIALECTS[dialect](reply))


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_every_single_cut(dialect: str) -> None:
    data = stream_bytes(dialect)
    wire = Wire(dialect)
    assert await wire.events([data]) == EXPECTED
    for i in range(1, len(data)):
        assert await wire.events([data[:i], data[i:]]) == EXPECTED, f"cut at byte {i}"


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_one_byte_at_a_time(dialect: str) -> None:
    data = stream_bytes(dialect)
    assert await Wire(dialect).events([bytes([b]) for b in data]) == EXPECTED


@pytest.mark.parametrize("dialect", DIALECTS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=1, max_value=10_000), max_size=40))
async def test_random_cuts(dialect: str, cuts: list[int]) -> None:
    data = stream_bytes(dialect)
    chunks = split(data, [c % len(data) or 1 for c in cuts])
    assert await Wire(dialect).events(chunks) == EXPECTED


# Any JSON object the model might write, fragmented anywhere in its text and in its bytes.
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


@pytest.mark.parametrize("dialect", DIALECTS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arguments=st.dictionaries(st.text(max_size=8), _json_values, max_size=4),
    ascii_only=st.booleans(),
    data=st.data(),
)
async def test_any_arguments_any_fragments(
    dialect: str, arguments: dict[str, Any], ascii_only: bool, data: st.DataObject
) -> None:
    text = json.dumps(arguments, ensure_ascii=ascii_only)
    text_cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10), label="text cuts")
    bounds = [0, *sorted(set(text_cuts)), len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    reply = Reply(tool_calls=[ToolCall(id="call_1", name="t", arguments=text, pieces=pieces)])
    raw = stream_bytes(dialect, reply)
    byte_cuts = data.draw(st.lists(st.integers(1, len(raw) - 1), max_size=20), label="cuts")
    events = await Wire(dialect).events(split(raw, byte_cuts))
    assert events[0] == ToolCallRequest("call_1", "t", text)
    assert json.loads(events[0].arguments) == arguments
    assert isinstance(events[1], Finish) and len(events) == 2


# --- streams that end early ----------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_clean_end_before_the_end_marker_is_retryable(dialect: str) -> None:
    """A proxy may close the body properly mid-message; that is still a dropped stream."""
    frames = DIALECTS[dialect](REPLY)
    # Keep everything up to the text delta: no finish, no end marker.
    cut = next(i for i, f in enumerate(frames) if f.content) + 1
    wire = Wire(dialect)
    wire.chunks = [b"".join(f.data for f in frames[:cut])]
    received: list[Any] = []
    with pytest.raises(ProviderRetryable) as caught:
        async for event in wire.provider.stream(REQUEST):
            received.append(event)
    assert received == [TextDelta("Checking ☕ ")]
    assert caught.value.code == "stream_incomplete"


async def test_anthropic_error_event_mid_stream_is_retryable() -> None:
    frames = anthropic_sse(REPLY)
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    overloaded = f"event: error\ndata: {json.dumps(error)}\n\n".encode()
    wire = Wire("anthropic")
    wire.chunks = [b"".join(f.data for f in frames[:4]), overloaded]
    received: list[Any] = []
    with pytest.raises(ProviderRetryable) as caught:
        async for event in wire.provider.stream(REQUEST):
            received.append(event)
    assert received == [TextDelta("Checking ☕ ")]
    assert caught.value.code == "stream_error"
    assert "overloaded_error" in str(caught.value)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"type": "server_error", "message": "The server had an error"}, ProviderRetryable),
        ({"type": "invalid_request_error", "message": "Bad"}, ProviderFatal),
    ],
)
async def test_openai_error_object_mid_stream(error: dict[str, Any], kind: type) -> None:
    """An OpenAI-compatible server that fails after a 200 puts an error object in the stream:
    the text before it stands, and the error is classified by its type."""
    frames = openai_sse(REPLY)
    cut = next(i for i, f in enumerate(frames) if f.content) + 1
    wire = Wire("openai")
    failure = f"data: {json.dumps({'error': error})}\n\n".encode()
    wire.chunks = [b"".join(f.data for f in frames[:cut]), failure]
    received: list[Any] = []
    with pytest.raises(kind) as caught:
        async for event in wire.provider.stream(REQUEST):
            received.append(event)
    assert received == [TextDelta("Checking ☕ ")]
    assert caught.value.code == "stream_error"
    assert error["type"] in str(caught.value) and error["message"] not in str(caught.value)


def _spread_stream() -> tuple[bytes, bytes]:
    """The recorded stream with a keep-alive comment first, and its first chunk's JSON over
    two `data:` lines of an event that also has `event:` and `id:` fields: (that head, the
    rest)."""
    frames = openai_sse(REPLY)
    payload = frames[0].data.decode().removeprefix("data: ").rstrip("\n")
    at = payload.index(",")
    spread = f"event: chunk\nid: 7\ndata: {payload[:at]}\ndata:{payload[at:]}\n\n".encode()
    return b": keep-alive\n\n" + spread, b"".join(f.data for f in frames[1:])


def _cuts(head: bytes, data: bytes) -> list[int]:
    """Every cut in the head, and every cut of the rest within two bytes of a line end's
    bytes: a cut between a CR and its LF, or just before or after either. A cut anywhere
    else in the rest splits a JSON text or a field name, as in test_every_single_cut."""
    ends = [i for i, byte in enumerate(data) if byte in b"\r\n"]
    near = {cut for end in ends for cut in range(end - 1, end + 3) if 0 < cut < len(data)}
    return sorted(set(range(1, len(head) + 1)) | near)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
async def test_openai_event_stream_format(newline: bytes) -> None:
    """Comments, other fields and an event's data over several lines read as the event-stream
    format says, with lines ended by LF, CRLF or a lone CR; cut anywhere in the fields or at
    any line end, a CRLF is one line end (not an empty line, which would end the event before
    its second data line)."""
    head, rest = (part.replace(b"\n", newline) for part in _spread_stream())
    data = head + rest
    wire = Wire("openai")
    assert await wire.events([data]) == EXPECTED
    for i in _cuts(head, data):
        assert await wire.events([data[:i], data[i:]]) == EXPECTED, f"cut at byte {i}"
