"""A run's output folder: complete checkpoints and which one to resume from (`checkpoints.py`), the resume rules
(`resume.py`), the run's lock (`lock.py`). Neither TRL nor torch at import: the CLI reads it first."""
