"""Moved to :mod:`divrl.data.reference_store` (kept so old imports work)."""

from divrl.data.reference_store import ReferenceSample, ReferenceStore, write_reference_store

__all__ = ["ReferenceSample", "ReferenceStore", "write_reference_store"]
