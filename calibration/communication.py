"""Every measured collective at once: the ``collectives`` section of a profile.

:class:`CollectiveModels` fits one :class:`calibration.algorithms.CollectiveModel` per
collective found in the records and answers ``predict(op, nbytes, ranks, ranks_per_node)``,
the ``collective_time`` the simulator's cost interface needs. A collective that cannot be fitted
(measured at one rank only, say) is recorded in ``skipped_`` with the reason, not fatal; no
collective fitted at all is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from .algorithms import CollectiveModel
from .collective_regimes import InterNode
from .profile_checks import FieldError
from .readers import collective_points
from .stats import FitError

__all__ = ["CollectiveModels"]


class CollectiveModels:
    """One fitted :class:`~calibration.algorithms.CollectiveModel` per collective.

    ``ops``: which to fit (default: every op in the records). ``g_s_per_byte`` and
    ``inter_node`` (per op) are passed on. Fitted: ``models_`` (op -> model), ``skipped_``
    (op -> why).
    """

    def __init__(
        self,
        ops: Iterable[str] | None = None,
        g_s_per_byte: float | None = None,
        inter_node: Mapping[str, InterNode] | None = None,
        n_boot: int = 200,
        seed: int = 0,
    ) -> None:
        self.ops = None if ops is None else tuple(ops)
        self.g_s_per_byte = g_s_per_byte
        self.inter_node = dict(inter_node or {})
        self.n_boot, self.seed = n_boot, seed

    def fit(self, df: pd.DataFrame) -> CollectiveModels:
        points = collective_points(df)
        ops = self.ops or tuple(sorted(points["op"].unique()))
        self.models_: dict[str, CollectiveModel] = {}
        self.skipped_: dict[str, str] = {}
        for op in ops:
            model = CollectiveModel(
                op,
                g_s_per_byte=self.g_s_per_byte,
                inter_node=self.inter_node.get(op),
                n_boot=self.n_boot,
                seed=self.seed,
            )
            try:
                self.models_[op] = model.fit(points)
            except FitError as exc:
                self.skipped_[op] = str(exc)
        if not self.models_:
            reasons = "; ".join(self.skipped_.values()) or "no collectives in the records"
            raise FitError(f"no collective could be fitted ({reasons})")
        return self

    def predict(self, op: str, nbytes: Any, ranks: Any, ranks_per_node: Any = None) -> np.ndarray:
        """Seconds of collective ``op``; see :meth:`CollectiveModel.predict`."""
        if op not in self.models_:
            known = ", ".join(self.models_)
            raise KeyError(f"no fitted model for collective {op!r} (fitted: {known})")
        return self.models_[op].predict(nbytes, ranks, ranks_per_node)

    def quality_dict(self) -> dict[str, Any]:
        return {op: m.quality_.to_dict() for op, m in self.models_.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": "collectives",
            "collectives": {op: m.to_dict() for op, m in self.models_.items()},
            "skipped": dict(self.skipped_),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectiveModels:
        models = {op: _model(op, d) for op, d in data["collectives"].items()}
        if not models:
            raise ValueError("the collectives section holds no collective")
        self = cls(ops=tuple(models))
        self.models_, self.skipped_ = models, dict(data.get("skipped") or {})
        return self


def _model(op: str, doc: dict[str, Any]) -> CollectiveModel:
    """One collective's model; a :class:`FieldError` it raises names its field under the
    section (``collectives.<op>.``)."""
    try:
        if doc.get("op") != op:
            raise FieldError("op", f"{doc.get('op')!r} under the key {op!r}; the two must agree")
        return CollectiveModel.from_dict(doc)
    except FieldError as exc:
        raise exc.within(f"collectives.{op}") from None
