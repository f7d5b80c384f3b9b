"""Benchmarks (scripts; see README.md). A package so that tests can import their helpers."""
