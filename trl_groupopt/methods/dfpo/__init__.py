"""DFPO: in-group re-weighting of GSPO's ratios that restores token-gradient cancellation, and its GRPO-fix mode (arXiv:2604.13088)."""
