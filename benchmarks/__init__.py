"""Benchmarks of trl-groupopt: step-time overhead against TRL's GRPOTrainer (`benchmarks.overhead`), the regimes
where each paper claims its advantage (`benchmarks.stress`), sample efficiency (`benchmarks.sample_efficiency`), and
the markdown tables the README includes (`benchmarks.report`). Run them as modules from the repo root, e.g.
``python -m benchmarks.overhead --smoke``; see benchmarks/README.md."""
