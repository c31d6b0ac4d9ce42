"""The methods, one folder each (`<name>/`: `objective.py` pure torch, `trainer.py` config and trainer, `spec.py` the
spec), the plain data a method is described by (`spec.py`, `mechanism.py`) and their registry (`registry.py`)."""
