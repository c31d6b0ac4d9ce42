"""OTB: advantages from the optimal token baseline (arXiv:2602.07078)."""
