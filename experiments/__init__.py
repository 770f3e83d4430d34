"""Experiments run on top of divrl: the toy-scale reproduction of the papers' claims.

Run from the repository root (``python -m experiments.reproduce``); the modules import
each other as ``experiments.<name>`` (no ``sys.path`` edits).
"""
