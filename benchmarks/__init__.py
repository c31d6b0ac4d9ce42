"""Benchmarks of trl-groupopt, run as modules from the repo root (``python -m benchmarks.NAME``): benchmarks/README.md
lists each one, what it measures and what it writes."""
