"""PROVE: real training runs (serial, threads, MPI, hybrid, GPU) with per-phase timers."""
