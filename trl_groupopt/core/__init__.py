"""The pure math every objective uses: plain torch, no TRL, no method (`common.py`: masks, groups, checks, TRL's
clipped surrogate; `estimators.py`: the advantage estimators; `registry.py`: the generic registry)."""
