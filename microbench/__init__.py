"""MEASURE: compute kernels, MPI collectives, host<->device copies and jitter.

This package depends on numpy and mpi4py (numba, cupy or torch optional) and never on
``pdlsim`` or ``calibration``, so it can be copied to a cluster and run as a job. That is why
it also holds what every package shares: the workload description, the real network and its
kernels, the records format and the one user-facing exception type.
"""
