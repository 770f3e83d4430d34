"""divrl inside other training frameworks (optional extras, imported on demand).

- ``divrl.integrations.trl``: DPH-RL and divrl's policy losses (Lp-Reg, ...) inside TRL's
  ``GRPOTrainer`` (``pip install "divrl[trl]"``; see docs/trl.md).

Nothing here imports an optional framework: ``import divrl.integrations`` works without them.
"""
