"""The real network that ``pdlsim train`` runs, built from a workload description.

:class:`Network` holds all parameters in one flat float32 array (and the gradients in another
of the same layout), runs forward and backward with the kernels of :mod:`microbench.kernels`
(numba on numpy arrays, array-module kernels on cupy), and :class:`SGD` updates in place.
"""

from pdlsim.nn.network import INITS, Network, init_params
from pdlsim.nn.optim import SGD

__all__ = ["INITS", "SGD", "Network", "init_params"]
