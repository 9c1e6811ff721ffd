"""The model gateway: the one place that talks to model providers.

The provider adapters (`gateway.openai_compat`, `gateway.anthropic`) are imported where
used, so importing the gateway does not load the provider SDKs.
"""

from parley.gateway.base import Finish, ModelProvider, ModelRequest, TextDelta, ToolCallRequest
from parley.gateway.errors import ProviderError, ProviderFatal, ProviderRetryable, Timeouts
from parley.gateway.registry import ProviderPool, build_provider

__all__ = [
    "Finish",
    "ModelProvider",
    "ModelRequest",
    "ProviderError",
    "ProviderFatal",
    "ProviderRetryable",
    "TextDelta",
    "Timeouts",
    "ToolCallRequest",
    "ProviderPool",
    "build_provider",
]
