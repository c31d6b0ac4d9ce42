"""`trl-groupopt compare` (`driver.py`; `trl_groupopt.compare(...)` is its Python twin): paired-seed runs (`runs.py`),
their statistics (`stats.py`) and compare.md / compare.png (`report.py`)."""
