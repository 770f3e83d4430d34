"""Modules of the ``divrl`` subcommands (see ``divrl/cli.py``)."""

# the toy world registers its solution styles (toy math's method) for every command; the
# import is cheap (divrl.toy loads its builder and model lazily)
import divrl.toy  # noqa: F401
