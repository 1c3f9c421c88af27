"""Cost formulas of MPI collective algorithms, linear in the link parameters.

Every formula is ``T = A(p) a + B(p, n) b + G(p, n) g`` with ``a`` the latency of one message,
``b`` the time per byte moved and ``g`` the time per byte reduced (Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005; Chan et al. 2007
for the broadcast). :func:`coefficients` returns the columns ``(A, B, G)``, so that the
calibration fits ``a, b, g`` by linear least squares. The allreduce algorithms and the binomial
broadcast, which the simulator plays step by step, are summed from the very steps it plays
(:mod:`microbench.collective_steps`); the others (allgather, reduce-scatter, the
scatter-allgather broadcast, barrier, ping-pong) are timed only here and written as formulas.
``n`` is microbench's ``bytes`` (see :mod:`microbench.collectives`): the buffer for allreduce
and bcast, each rank's block for allgather and reduce_scatter, whose formulas use the
whole vector ``N = p n``.

Non-powers of two: recursive doubling and Rabenseifner first fold the ``p - q`` extra ranks into
the largest power of two ``q`` below ``p`` (one exchange of the whole vector and a reduction)
and send them the result at the end (one more exchange), as MPICH does (the steps say so); the
binomial and Bruck forms use ``ceil(lg p)`` steps.

In every allreduce and reduce_scatter formula ``b`` and ``g`` come in a fixed ratio at powers of
two (ring ``2:1``, recursive doubling ``1:1``, ...), so one collective's timings cannot tell
them apart: the calibration fixes ``g`` (0 or a given reduction rate) and lets ``b`` absorb it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from microbench.collective_steps import pattern_columns

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "TWO_LEVEL_OPS",
    "coefficients",
    "cost",
    "design",
    "two_level_coefficients",
]

Columns = tuple[np.ndarray, np.ndarray, np.ndarray]
Formula = Callable[[np.ndarray, np.ndarray], Columns]


def _clg(p: np.ndarray) -> np.ndarray:
    return np.ceil(np.log2(p) - 1e-12)


def _stepped(name: str) -> Formula:
    """The closed form of the pattern ``name`` written in :mod:`microbench.collective_steps`:
    its steps (A), the bytes each sends (B = n x the fractions' sum) and reduces (G)."""

    def columns(p: np.ndarray, n: np.ndarray) -> Columns:
        whole = np.rint(p)
        if np.any(np.abs(p - whole) > 1e-9):
            raise ValueError(f"{name}: rank counts must be whole numbers")
        counts, where = np.unique(whole.ravel(), return_inverse=True)  # few, over many points
        per = np.array([pattern_columns(name, int(q)) for q in counts]).reshape(-1, 3)[where]
        return per[:, 0], per[:, 1] * n, per[:, 2] * n

    return columns


def _scatter_allgather_bcast(p: np.ndarray, n: np.ndarray) -> Columns:
    return _clg(p) + p - 1, 2 * n * (p - 1) / p, 0 * n


def _ring_allgather(p: np.ndarray, n: np.ndarray) -> Columns:
    return p - 1, n * (p - 1), 0 * n  # N (p - 1) / p with N = p n


def _recursive_doubling_allgather(p: np.ndarray, n: np.ndarray) -> Columns:
    return _clg(p), n * (p - 1), 0 * n  # Bruck's algorithm at non-powers of two


def _pairwise_reduce_scatter(p: np.ndarray, n: np.ndarray) -> Columns:
    return p - 1, n * (p - 1), n * (p - 1)


def _recursive_halving_reduce_scatter(p: np.ndarray, n: np.ndarray) -> Columns:
    return _clg(p), n * (p - 1), n * (p - 1)


def _dissemination_barrier(p: np.ndarray, n: np.ndarray) -> Columns:
    return _clg(p), 0 * n, 0 * n


def _direct_pingpong(p: np.ndarray, n: np.ndarray) -> Columns:
    return 1 + 0 * p, n + 0 * p, 0 * n  # one message between two ranks, whatever p is


ALGORITHMS: dict[str, dict[str, Formula]] = {
    "allreduce": {
        "ring": _stepped("ring"),
        "recursive_doubling": _stepped("recursive_doubling"),
        "rabenseifner": _stepped("rabenseifner"),
        "binomial": _stepped("binomial"),
    },
    "bcast": {"binomial": _stepped("broadcast"), "scatter_allgather": _scatter_allgather_bcast},
    "allgather": {"ring": _ring_allgather, "recursive_doubling": _recursive_doubling_allgather},
    "reduce_scatter": {
        "pairwise": _pairwise_reduce_scatter,
        "recursive_halving": _recursive_halving_reduce_scatter,
    },
    "barrier": {"dissemination": _dissemination_barrier},
    "pingpong": {"direct": _direct_pingpong},
}

# Used when the data cannot choose (one process count): what MPICH and Open MPI use for large
# messages, which dominate training traffic.
DEFAULT_ALGORITHM = {
    "allreduce": "rabenseifner",
    "bcast": "scatter_allgather",
    "allgather": "ring",
    "reduce_scatter": "pairwise",
    "barrier": "dissemination",
    "pingpong": "direct",
}

TWO_LEVEL_OPS = ("allreduce", "bcast")


def _arrays(*values: Any) -> list[np.ndarray]:
    return [np.asarray(v, dtype=float) for v in np.broadcast_arrays(*values)]


def coefficients(op: str, algorithm: str, ranks: Any, nbytes: Any) -> np.ndarray:
    """Columns ``(A, B, G)`` of ``algorithm`` for ``op``: shape ``(points, 3)``."""
    if op not in ALGORITHMS:
        raise ValueError(f"no cost formulas for {op!r}; known: {', '.join(ALGORITHMS)}")
    if algorithm not in ALGORITHMS[op]:
        known = ", ".join(ALGORITHMS[op])
        raise ValueError(f"{op} has no algorithm {algorithm!r}; known: {known}")
    p, n = _arrays(ranks, nbytes)
    if np.any(p < 1):
        raise ValueError("ranks must be at least 1")
    columns = ALGORITHMS[op][algorithm](p.ravel(), n.ravel())
    return np.column_stack([np.broadcast_to(c, p.ravel().shape) for c in columns])


def cost(op: str, algorithm: str, ranks: Any, nbytes: Any, a: float, b: float, g: float = 0.0):
    """Seconds of ``algorithm`` at ``ranks`` and ``nbytes`` for link parameters a, b, g
    (the broadcast shape of ``ranks`` and ``nbytes``)."""
    shape = np.broadcast(np.asarray(ranks), np.asarray(nbytes)).shape
    times = coefficients(op, algorithm, ranks, nbytes) @ np.array([a, b, g], dtype=float)
    return times.reshape(shape)


def two_level_coefficients(
    op: str, inter_algorithm: str, ranks: Any, ranks_per_node: Any, nbytes: Any
) -> np.ndarray:
    """Columns ``(a_intra, b_intra, a_inter, b_inter, g)`` of a hierarchical collective.

    allreduce: binomial reduce inside each node, ``inter_algorithm`` allreduce across the node
    leaders, binomial broadcast inside each node. bcast: ``inter_algorithm`` broadcast across
    the leaders, then binomial inside each node. Other ops: their flat ``inter_algorithm`` form
    over all ranks with the inter-node parameters, since every step of a ring or pairwise
    exchange waits for its slowest link, which crosses nodes (an upper bound for the others).
    Nodes = ``ceil(ranks / ranks_per_node)``.
    """
    p, q, n = _arrays(ranks, ranks_per_node, nbytes)
    p, q, n = p.ravel(), np.minimum(q.ravel(), p.ravel()), n.ravel()
    zero = np.zeros_like(p)
    if op not in TWO_LEVEL_OPS:
        flat = coefficients(op, inter_algorithm, p, n)
        return np.column_stack([zero, zero, flat[:, 0], flat[:, 1], flat[:, 2]])
    nodes = np.ceil(p / q - 1e-12)
    inter = coefficients(op, inter_algorithm, nodes, n)
    steps = _clg(q)
    if op == "allreduce":
        a_intra, b_intra, g_intra = 2 * steps, 2 * steps * n, steps * n
    else:
        a_intra, b_intra, g_intra = steps, steps * n, zero
    return np.column_stack([a_intra, b_intra, inter[:, 0], inter[:, 1], g_intra + inter[:, 2]])


def design(
    op: str,
    algorithm: str,
    inter_algorithm: str | None,
    ranks: np.ndarray,
    ranks_per_node: np.ndarray,
    nbytes: np.ndarray,
    g: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(X, offset)`` for fitting: times = ``X @ theta + offset``.

    ``theta`` = ``(a, b)`` with ``inter_algorithm`` None (one node), else ``(a_intra, b_intra,
    a_inter, b_inter)``; points with ``ranks_per_node < ranks`` use the two-level columns.
    ``offset``: the reduction time at the given ``g`` (fixed, not fitted).
    """
    p, q, n = _arrays(ranks, ranks_per_node, nbytes)
    p, q, n = p.ravel(), q.ravel(), n.ravel()
    flat = q >= p
    x = np.zeros((p.size, 2 if inter_algorithm is None else 4))
    offset = np.zeros(p.size)
    cols = coefficients(op, algorithm, p[flat], n[flat])
    x[flat, :2], offset[flat] = cols[:, :2], g * cols[:, 2]
    if inter_algorithm is not None and not np.all(flat):
        cols = two_level_coefficients(op, inter_algorithm, p[~flat], q[~flat], n[~flat])
        x[~flat], offset[~flat] = cols[:, :4], g * cols[:, 4]
    return x, offset
