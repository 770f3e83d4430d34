"""Modules of the ``divrl`` subcommands (see ``divrl/cli.py``)."""
