"""ECHO: batch-level clipping with token-level importance sampling (Efficient Coarse-grained Hybrid Optimization)."""
