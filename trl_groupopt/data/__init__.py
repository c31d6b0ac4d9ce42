"""The data door: user data loaded and checked before any model loads (`adapters.py`), reward functions and their
checks (`rewards.py`, `checks.py`), the synthetic task and the embedded tiny policy (`offline.py`)."""
