"""Builds the configured provider.

`settings.model_provider` picks the adapter; where the provider lives and the key come from
the SDKs' own variables (`OPENAI_BASE_URL`/`OPENAI_API_KEY`,
`ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`), so any tool that knows those conventions can
point Parley at a server. Keys are passed to the SDK and never logged.
"""

from __future__ import annotations

import os

from gateway.base import ModelProvider
from gateway.demo import DemoModel
from gateway.errors import Timeouts
from parley.config import Settings


def model_timeouts(settings: Settings) -> Timeouts:
    # getattr: the settings fields may not exist yet in every deployment's config.
    defaults = Timeouts()
    return Timeouts(
        connect_s=float(getattr(settings, "model_connect_timeout_s", defaults.connect_s)),
        first_token_s=float(
            getattr(settings, "model_first_token_timeout_s", defaults.first_token_s)
        ),
        total_s=float(getattr(settings, "model_total_timeout_s", defaults.total_s)),
    )


def build_provider(settings: Settings) -> ModelProvider:
    if settings.model_provider == "demo":
        return DemoModel(token_delay_s=settings.demo_token_delay_ms / 1000.0)
    # The SDKs are imported only when used: a demo deployment does not load them.
    if settings.model_provider == "openai":
        from gateway.openai_compat import OpenAICompatProvider

        return OpenAICompatProvider(
            base_url=os.environ.get("OPENAI_BASE_URL") or None,
            api_key=_required_key("OPENAI_API_KEY"),
            timeouts=model_timeouts(settings),
        )
    if settings.model_provider == "anthropic":
        from gateway.anthropic import AnthropicProvider

        return AnthropicProvider(
            base_url=os.environ.get("ANTHROPIC_BASE_URL") or None,
            api_key=_required_key("ANTHROPIC_API_KEY"),
            timeouts=model_timeouts(settings),
        )
    raise ValueError(f"unknown model provider {settings.model_provider!r}")


def _required_key(variable: str) -> str:
    key = os.environ.get(variable)
    if not key:
        # Local OpenAI-compatible servers ignore the key, but the SDK still wants one.
        raise ValueError(f"{variable} must be set (any non-empty value for a local server)")
    return key
