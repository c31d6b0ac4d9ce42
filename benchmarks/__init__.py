"""Benchmarks of trl-groupopt: step-time overhead against TRL's GRPOTrainer (`benchmarks.overhead`), the one runner of
the training benchmarks (`benchmarks.stress`: the stress grid, the claims grid, sample efficiency), the power analysis
of the claims (`benchmarks.power`) and the results page's tables (`benchmarks.report`). Run them as modules from the
repo root, e.g. ``python -m benchmarks.stress --smoke``; see benchmarks/README.md."""
