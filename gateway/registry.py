"""Builds the configured provider.

`settings.model_provider` picks the adapter; where the provider lives and the key come from
the SDKs' own variables (`OPENAI_BASE_URL`/`OPENAI_API_KEY`,
`ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`), so any tool that knows those conventions can
point Parley at a server. Keys are passed to the SDK and never logged.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from parley.config import Settings
from parley.gateway.base import ModelProvider
from parley.gateway.demo import DemoModel
from parley.gateway.errors import Timeouts


def model_timeouts(settings: Settings) -> Timeouts:
    return Timeouts(
        connect_s=settings.model_connect_timeout_s,
        first_token_s=settings.model_first_token_timeout_s,
        total_s=settings.model_total_timeout_s,
    )


def build_provider(settings: Settings, name: str | None = None) -> ModelProvider:
    """The provider called `name` (default: the configured one), credentials from the SDKs'
    own environment variables."""
    name = name or settings.model_provider
    if name == "demo":
        return DemoModel(token_delay_s=settings.demo_token_delay_ms / 1000.0)
    # The SDKs are imported only when used: a demo deployment does not load them.
    if name == "openai":
        from parley.gateway.openai_compat import OpenAICompatProvider

        return OpenAICompatProvider(
            base_url=os.environ.get("OPENAI_BASE_URL") or None,
            api_key=_required_key("OPENAI_API_KEY"),
            timeouts=model_timeouts(settings),
        )
    if name == "anthropic":
        from parley.gateway.anthropic import AnthropicProvider

        return AnthropicProvider(
            base_url=os.environ.get("ANTHROPIC_BASE_URL") or None,
            api_key=_required_key("ANTHROPIC_API_KEY"),
            timeouts=model_timeouts(settings),
        )
    raise ValueError(f"unknown model provider {name!r}")


class ProviderPool:
    """Providers by name, built on first use. Instances handed in serve as the configured
    primary (and fallback), under the configured names as well as their own. `wrap`, when
    given, wraps every provider (a span around each call when tracing is on)."""

    def __init__(
        self,
        settings: Settings,
        *,
        primary: ModelProvider | None = None,
        fallback: ModelProvider | None = None,
        wrap: Callable[[ModelProvider], ModelProvider] | None = None,
    ) -> None:
        self._settings = settings
        self._providers: dict[str, ModelProvider] = {}
        self._wrap = wrap or (lambda provider: provider)
        primary = self._wrap(primary) if primary is not None else None
        fallback = self._wrap(fallback) if fallback is not None else None
        if fallback is not None:
            self._providers[fallback.name] = fallback
            if settings.fallback_model_provider:
                self._providers[settings.fallback_model_provider] = fallback
        if primary is not None:
            self._providers[primary.name] = primary
            self._providers[settings.model_provider] = primary

    def get(self, name: str) -> ModelProvider:
        if name not in self._providers:
            self._providers[name] = self._wrap(build_provider(self._settings, name))
        return self._providers[name]

    async def aclose(self) -> None:
        for provider in self._providers.values():
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()


def _required_key(variable: str) -> str:
    key = os.environ.get(variable)
    if not key:
        # Local OpenAI-compatible servers ignore the key, but the SDK still wants one.
        raise ValueError(f"{variable} must be set (any non-empty value for a local server)")
    return key
