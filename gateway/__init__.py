"""The model gateway: the one place that talks to model providers."""

from gateway.base import Finish, ModelProvider, ModelRequest, TextDelta, ToolCallRequest
from gateway.registry import build_provider

__all__ = [
    "Finish",
    "ModelProvider",
    "ModelRequest",
    "TextDelta",
    "ToolCallRequest",
    "build_provider",
]
