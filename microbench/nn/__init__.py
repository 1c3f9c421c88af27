"""The real network that ``pdlsim train`` runs, built from a workload description.

It is here, not in pdlsim, so that the jitter and compute benchmarks run exactly the step that
training runs, on a cluster where only microbench was copied.

:class:`Network` holds all parameters in one flat float32 array (and the gradients in another
of the same layout), runs forward and backward with the kernels of :mod:`microbench.kernels`
(numba on numpy arrays, array-module kernels on cupy), and :class:`SGD` or :class:`Adam`
(:func:`make_optimizer`) updates in place.
"""

from microbench.nn.network import INITS, Network, init_params, random_batch
from microbench.nn.optim import OPTIMIZERS, SGD, Adam, make_optimizer

__all__ = [
    "INITS",
    "OPTIMIZERS",
    "SGD",
    "Adam",
    "Network",
    "init_params",
    "make_optimizer",
    "random_batch",
]
