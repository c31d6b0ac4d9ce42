"""The TRL shell: `GroupOptTrainer` (`base.py`), TRL's `GRPOTrainer` with a pluggable objective and advantage
estimator, and what it needs around a run (configs, batching, metrics, checks, the model card)."""
