"""Modules of the ``divrl`` subcommands (see ``divrl/cli.py``)."""

# the toy world registers its solution styles (toy math's method) for every command, and
# its registry hands the rewards the source finder that imports the world declaring a data
# source (a world's own verifier), for every command that reads or scores rows; the import
# is cheap (divrl.toy loads its builders and models lazily)
import divrl.toy.worlds  # noqa: F401
