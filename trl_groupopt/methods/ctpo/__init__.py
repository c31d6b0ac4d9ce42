"""CTPO: cumulative-prefix importance ratio with position-adaptive log-space clipping (arXiv:2605.07331)."""
