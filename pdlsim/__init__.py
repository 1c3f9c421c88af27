"""pdlsim: predict how data-parallel and hybrid neural-network training scales.

The loop: ``microbench`` measures the machine, ``calibration`` fits cost models, and
``pdlsim`` simulates a cluster and proves its predictions against real training runs.
"""

__version__ = "0.1.0"
