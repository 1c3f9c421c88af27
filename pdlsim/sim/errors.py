"""The simulator's one error type for configurations that make no sense."""

from __future__ import annotations

from microbench.errors import UserError

__all__ = ["ConfigError"]


class ConfigError(UserError, ValueError):
    """A cluster or scenario that makes no sense (one line, says what and why).

    A :class:`~microbench.errors.UserError`: a script builds a :class:`~pdlsim.sim.Cluster` or
    a :class:`~pdlsim.sim.Scenario` itself (``pdlsim.Cluster.gpus(0, 8)``), so its refusal is
    bad input, caught as every other one is; a ``ValueError`` too, for the callers that catch
    the cost model's checks alongside it."""
