"""pdlsim: predict how data-parallel and hybrid neural-network training scales.

The loop: ``microbench`` measures the machine, ``calibration`` fits cost models, and
``pdlsim`` simulates a cluster and proves its predictions against real training runs.

The Python API (:mod:`pdlsim.api`), loaded on first use so that the command line starts light::

    import pdlsim

    p = pdlsim.predict("cnn", pdlsim.Cluster.gpus(nodes=16, gpus_per_node=4), batch=32)
    table = pdlsim.sweep(pdlsim.Workload.load("mlp"), nodes=[1, 2, 4], per_node=[1, 2])
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Cluster", "Workload", "collective", "load_profile", "predict", "sweep"]


def __getattr__(name: str) -> Any:
    """The API's names, imported from :mod:`pdlsim.api` when first asked for."""
    if name in __all__:
        import pdlsim.api

        return getattr(pdlsim.api, name)
    raise AttributeError(f"module 'pdlsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
