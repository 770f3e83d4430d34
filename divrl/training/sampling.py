"""Moved to :mod:`divrl.data.sampling` (kept so old imports work)."""

from divrl.data.sampling import EpochSampler, derive_seed

__all__ = ["EpochSampler", "derive_seed"]
