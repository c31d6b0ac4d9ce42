"""Benchmarks of trl-groupopt: step-time overhead against TRL's GRPOTrainer (`benchmarks.overhead`), the regimes
where each paper claims its advantage (`benchmarks.stress`), sample efficiency (`benchmarks.sample_efficiency`), both
on the shared grid runner (`benchmarks.runner`), and the markdown tables of the results page, docs/results.md
(`benchmarks.report`). Run them as modules from the repo root, e.g. ``python -m benchmarks.overhead --smoke``; see
benchmarks/README.md."""
