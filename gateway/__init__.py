"""The model gateway: the one place that talks to model providers."""

from gateway.base import Finish, ModelProvider, ModelRequest, TextDelta
from gateway.registry import build_provider

__all__ = ["Finish", "ModelProvider", "ModelRequest", "TextDelta", "build_provider"]
