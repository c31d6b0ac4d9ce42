"""GRPO: TRL's objective through the shared loss path, the baseline (arXiv:2402.03300)."""
