"""Tests of microbench."""
