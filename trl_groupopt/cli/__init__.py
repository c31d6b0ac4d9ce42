"""The `trl-groupopt` command line (`main.py`; `python -m trl_groupopt.cli`), its TRL half (`script.py`) and the
defaults' layers (`defaults.py`). Importing it imports no TRL."""
