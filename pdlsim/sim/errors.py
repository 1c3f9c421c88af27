"""The simulator's one error type for configurations that make no sense."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A cluster or scenario that makes no sense (one line, says what and why)."""
