"""`python -m trl_groupopt.cli`: the `trl-groupopt` command."""

from .main import main

main()
