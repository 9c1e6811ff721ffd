"""How a provider failure reaches the caller: one small tree, and the time limits that feed it.

    ProviderError                 (provider, code, status, retry_after_s, request_id)
     ├── ProviderRetryable        429, 408, 409, 5xx, connection errors, timeouts (connect,
     │                            first token, total), a stream dropped or cut short
     └── ProviderFatal            every other 4xx: 400, 401, 403, 404, 413, 422, ...
                                  (a server's `x-should-retry` header overrides, as in the SDKs)

Retrying is not done here: SDK clients run with `max_retries=0` and the call-model activity's
Temporal retry policy decides (a `ProviderRetryable` may carry the server's `retry_after_s`).
Messages name the provider, the HTTP status and the provider's error *type*, never the
provider's free text, which can echo parts of a key ("Incorrect API key provided: sk-...").

The SDK-specific classification lives with each adapter; this module owns what they share:
status codes → tree, `retry-after` parsing, transport errors, and `guarded_stream`, which
applies the first-token and total deadlines around an SDK event stream.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx
import httpx2

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


class ProviderError(Exception):
    retryable: bool = False
    # What the provider reported it billed for the request before it failed (a stream that
    # broke after Anthropic's `message_start`), as `Finish.usage`; None: nothing reported.
    usage: dict[str, int] | None = None

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        code: str,
        status: int | None = None,
        retry_after_s: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        # A stable, short name for the failure ("rate_limited", "first_token_timeout", ...),
        # fit for a turn's error code.
        self.code = code
        self.status = status
        self.retry_after_s = retry_after_s
        # The provider's request id, for a support ticket; not a secret.
        self.request_id = request_id

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments are lost by Exception's default pickling.
        return (_rebuild, (type(self), self.message, self.__dict__))


def _rebuild(cls: type[ProviderError], message: str, state: dict[str, Any]) -> ProviderError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class ProviderRetryable(ProviderError):
    """The same request may succeed later: overload, a network fault, a slow provider."""

    retryable = True


class ProviderFatal(ProviderError):
    """The request itself is wrong (or not allowed): sending it again cannot help."""


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    # No stream event within this many seconds of sending the request: give up. Also the
    # longest silence allowed between two reads once the stream flows.
    first_token_s: float = 30.0
    # The whole call, first byte to last.
    total_s: float = 300.0


_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "too_large",
    422: "unprocessable",
    429: "rate_limited",
}


def status_error(
    provider: str,
    status: int,
    *,
    headers: Mapping[str, str] | None = None,
    error_type: str | None = None,
) -> ProviderError:
    """Classify an HTTP error response the way the SDKs' own retry loops would."""
    headers = headers or {}
    should_retry = headers.get("x-should-retry")
    retryable = status in (408, 409, 429) or status >= 500
    if should_retry in ("true", "false"):  # the server's explicit verdict wins, as in the SDKs
        retryable = should_retry == "true"
    code = "server_error" if status >= 500 else _CODES.get(status, "client_error")
    detail = f" ({error_type[:64]})" if error_type else ""
    cls = ProviderRetryable if retryable else ProviderFatal
    return cls(
        f"{provider} returned HTTP {status}{detail}",
        provider=provider,
        code=code,
        status=status,
        retry_after_s=retry_after_seconds(headers) if retryable else None,
        request_id=headers.get("x-request-id") or headers.get("request-id"),
    )


def stream_error(provider: str, error_type: str | None) -> ProviderError:
    """An error event inside a stream that had started (HTTP 200)."""
    fatal = error_type in (
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
    )
    cls = ProviderFatal if fatal else ProviderRetryable
    detail = f" ({error_type[:64]})" if error_type else ""
    return cls(f"{provider} sent an error event{detail}", provider=provider, code="stream_error")


def error_type(body: object) -> str | None:
    """The provider's error type from an error body: OpenAI `{"error": {"type"|"code"}}` (the
    SDK may pass the inner object), Anthropic `{"type": "error", "error": {"type"}}`."""
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error", body)
    if not isinstance(inner, Mapping):
        return None
    value = inner.get("type") or inner.get("code")
    return str(value) if value else None


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """`retry-after-ms`, then `retry-after` as seconds or as an HTTP date."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        parsed = email.utils.parsedate_tz(value)
        if parsed is not None:
            return max(0.0, email.utils.mktime_tz(parsed) - time.time())
    return None


def transport_error(provider: str, exc: Exception, *, started: bool) -> ProviderError | None:
    """A network failure below the SDK (the Anthropic SDK lets these escape its streams)."""
    if isinstance(exc, httpx2.TimeoutException | httpx.TimeoutException):
        return timeout_error(provider, exc, started=started)
    if isinstance(exc, httpx2.HTTPError | httpx.HTTPError):
        return connection_error(provider, exc, started=started)
    return None


def timeout_error(provider: str, exc: Exception | None, *, started: bool) -> ProviderRetryable:
    cause = f" ({type(exc).__name__})" if exc is not None else ""
    if not started:
        return ProviderRetryable(
            f"{provider} sent nothing before the first-token timeout{cause}",
            provider=provider,
            code="first_token_timeout",
        )
    return ProviderRetryable(f"{provider} stream stalled{cause}", provider=provider, code="timeout")


def connection_error(provider: str, exc: Exception, *, started: bool) -> ProviderRetryable:
    # Only the exception's class name: its text may quote URLs or server words.
    cause = type(exc).__name__
    if not started:
        return ProviderRetryable(
            f"could not reach {provider} ({cause})", provider=provider, code="connection"
        )
    return ProviderRetryable(
        f"{provider} stream dropped mid-way ({cause})", provider=provider, code="stream_dropped"
    )


def incomplete_stream(provider: str) -> ProviderRetryable:
    """The body ended cleanly but without the provider's end-of-message marker."""
    return ProviderRetryable(
        f"{provider} stream ended before the message was complete",
        provider=provider,
        code="stream_incomplete",
    )


class EventStream(Protocol[_T_co]):
    """What both SDKs' `AsyncStream` offer."""

    def __aiter__(self) -> AsyncIterator[_T_co]: ...

    async def close(self) -> None: ...


Classify = Callable[[Exception, bool], ProviderError | None]


async def guarded_stream(
    provider: str,
    open_stream: Callable[[], Awaitable[EventStream[_T]]],
    timeouts: Timeouts,
    classify: Classify,
) -> AsyncGenerator[_T, None]:
    """Yield the SDK's events; turn slowness and SDK exceptions into `ProviderError`s.

    The deadlines wrap only our own awaits on the SDK (never the consumer's work between
    events), so a deadline can never cancel the caller's database write. `classify(exc,
    started)` maps the adapter's SDK exceptions; anything it does not know is re-raised
    unchanged, so a bug is not retried as if it were an outage.
    """
    loop = asyncio.get_running_loop()
    total_deadline = loop.time() + timeouts.total_s
    first_deadline = min(loop.time() + timeouts.first_token_s, total_deadline)
    stream: EventStream[_T] | None = None
    started = False
    try:
        while True:
            try:
                async with asyncio.timeout_at(total_deadline if started else first_deadline):
                    if stream is None:
                        stream = await open_stream()
                        events = aiter(stream)
                    event = await anext(events)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not started:
                    raise timeout_error(provider, None, started=False) from None
                raise ProviderRetryable(
                    f"{provider} exceeded the total timeout of {timeouts.total_s:g}s",
                    provider=provider,
                    code="total_timeout",
                ) from None
            except ProviderError:
                raise
            except Exception as exc:
                mapped = classify(exc, started)
                if mapped is None:
                    raise
                # Not chained: Temporal records causes in workflow history, and the SDK's
                # message quotes the provider's text.
                raise mapped from None
            started = True
            yield event
    finally:
        if stream is not None:
            await stream.close()
