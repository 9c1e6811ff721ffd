"""The key sets of tenants' identity providers, fetched over HTTP and kept in memory.

One `KeySets` per API process (api/main.py). A key set is fetched on first use and kept; it is
fetched again when a token names a key it does not hold (the provider rotated its keys) or
when it is older than `max_age_s` (so a key the provider withdrew stops working), but at most
once per `refetch_after_s` per key set: a stream of tokens naming made-up keys costs the
provider one request per interval, not one per token. While the provider cannot be reached
the keys already held keep working and any other key is refused (fail closed).

Redirects are not followed, and the URLs were checked against the deployment's egress rules
when the tenant's config was saved (api/routes/admin.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from jwt import PyJWK, PyJWKSet
from jwt.exceptions import PyJWKError, PyJWKSetError

from parley.oidc import OidcConfig, TokenUnknownKey
from parley.tls import httpx_verified

log = logging.getLogger(__name__)

# At most one fetch of a key set per this many seconds, whatever tokens arrive.
REFETCH_AFTER_S = 30.0
# A key set older than this is fetched again on its next use (a withdrawn key stops working).
MAX_AGE_S = 900.0
# Key sets and discovery documents are small; anything larger is not one.
MAX_DOCUMENT_BYTES = 256 * 1024
FETCH_TIMEOUT_S = 5.0


class KeyFetchFailed(Exception):
    """The provider's discovery document or key set could not be read."""


@dataclass(frozen=True)
class _Held:
    keys: tuple[PyJWK, ...]
    fetched_at: float

    def find(self, kid: str | None) -> PyJWK | None:
        if kid is None:  # a provider with one key may leave `kid` out
            return self.keys[0] if len(self.keys) == 1 else None
        return next((key for key in self.keys if key.key_id == kid), None)


class KeySets:
    def __init__(
        self,
        http: httpx.AsyncClient | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        refetch_after_s: float = REFETCH_AFTER_S,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self._http = http or httpx.AsyncClient(follow_redirects=False, verify=httpx_verified())
        # Injected so a test moves time forward instead of sleeping.
        self._clock = clock
        self._refetch_after_s = refetch_after_s
        self._max_age_s = max_age_s
        self._held: dict[tuple[str, str, str], _Held] = {}
        self._attempted: dict[tuple[str, str, str], float] = {}
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = {}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> KeySets:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def key(self, config: OidcConfig, kid: str | None) -> PyJWK:
        """The issuer's key `kid`; `TokenUnknownKey` when its key set does not hold it."""
        source = (config.issuer, *config.keys_at)
        held = self._held.get(source)
        found = held.find(kid) if held is not None else None
        if found is not None and not self._old(held):
            return found
        async with self._locks.setdefault(source, asyncio.Lock()):
            # Another request may have fetched it while this one waited.
            held = self._held.get(source)
            found = held.find(kid) if held is not None else None
            if (found is None or self._old(held)) and self._may_fetch(source):
                self._attempted[source] = self._clock()
                try:
                    self._held[source] = _Held(await self._fetch(config), self._clock())
                except KeyFetchFailed as exc:
                    log.warning("key set of %s not fetched: %s", config.issuer, exc)
                held = self._held.get(source)
                found = held.find(kid) if held is not None else None
        if found is None:
            raise TokenUnknownKey(f"the issuer's key set holds no key {kid!r}")
        return found

    def _old(self, held: _Held | None) -> bool:
        return held is None or self._clock() - held.fetched_at >= self._max_age_s

    def _may_fetch(self, source: tuple[str, str, str]) -> bool:
        last = self._attempted.get(source)
        return last is None or self._clock() - last >= self._refetch_after_s

    async def _fetch(self, config: OidcConfig) -> tuple[PyJWK, ...]:
        kind, url = config.keys_at
        if kind == "discovery":
            document = await self._get(url)
            if document.get("issuer") != config.issuer:
                raise KeyFetchFailed(
                    f"the discovery document names issuer {document.get('issuer')!r}"
                )
            named = document.get("jwks_uri")
            if not isinstance(named, str) or not named.startswith(("https://", "http://")):
                raise KeyFetchFailed("the discovery document names no jwks_uri")
            url = named
        keys = (await self._get(url)).get("keys")
        if not isinstance(keys, list):
            raise KeyFetchFailed("the key set has no `keys` list")
        # Keys for encryption are not for checking signatures.
        signing = [key for key in keys if isinstance(key, dict) and key.get("use", "sig") == "sig"]
        try:
            return tuple(PyJWKSet(signing).keys)
        except (PyJWKSetError, PyJWKError) as exc:
            raise KeyFetchFailed(f"the key set has no usable key: {exc}") from exc

    async def _get(self, url: str) -> dict[str, Any]:
        try:
            response = await self._http.get(url, timeout=FETCH_TIMEOUT_S)
            response.raise_for_status()
            if len(response.content) > MAX_DOCUMENT_BYTES:
                raise KeyFetchFailed(f"{url} answered more than {MAX_DOCUMENT_BYTES} bytes")
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise KeyFetchFailed(f"{url}: {exc}") from exc
        if not isinstance(document, dict):
            raise KeyFetchFailed(f"{url} answered no JSON object")
        return document
