"""Builds the configured provider."""

from __future__ import annotations

from gateway.base import ModelProvider
from gateway.demo import DemoModel
from parley.config import Settings


def build_provider(settings: Settings) -> ModelProvider:
    if settings.model_provider == "demo":
        return DemoModel(token_delay_s=settings.demo_token_delay_ms / 1000.0)
    raise ValueError(f"unknown model provider {settings.model_provider!r}")
