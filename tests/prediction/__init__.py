"""Tests of prediction."""
