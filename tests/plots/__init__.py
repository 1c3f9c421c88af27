"""Tests of plots."""
