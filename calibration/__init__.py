"""FIT: turn microbench records into cost models with uncertainty, written to a profile."""
