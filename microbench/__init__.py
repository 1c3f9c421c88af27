"""MEASURE: compute kernels, MPI collectives, host<->device copies and jitter.

This package depends on numpy and mpi4py (numba, cupy or torch optional) and never on
``pdlsim`` or ``calibration``, so it can be copied to a cluster and run as a job.
"""
