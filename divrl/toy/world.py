"""The old home of the SQL world and of the kit every world shares, kept so that old
imports work: the kit is :mod:`divrl.toy.kit`, the scaffold a world is written on
:mod:`divrl.toy.scaffold`, the SQL world :mod:`divrl.toy.sql_world`. Every public name of
the two (the SQL world's first) is read from here on first use."""

from __future__ import annotations

from typing import Any

from divrl.toy import kit, sql_world

__all__ = sorted({*kit.__all__, *sql_world.__all__})


def __getattr__(name: str) -> Any:
    for module in (sql_world, kit):
        if name in module.__all__:
            return getattr(module, name)
    raise AttributeError(f"module 'divrl.toy.world' has no attribute {name!r}")
