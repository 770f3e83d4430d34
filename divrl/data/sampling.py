"""Deterministic, resumable orders over prompts and reference samples."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EpochSampler", "derive_seed"]


def derive_seed(*parts: int) -> int:
    """A 31-bit seed that depends on every part (numpy's SeedSequence hashing)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1)


class EpochSampler:
    """Endless stream of indices into ``size`` items: a fresh permutation per epoch.

    The permutation of epoch ``e`` depends only on ``(seed, e)``, so the state is two
    integers and every process of a distributed run draws the same global order.
    """

    def __init__(self, size: int, seed: int, shuffle: bool = True) -> None:
        if size < 1:
            raise ValueError("EpochSampler needs at least one item")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.size)

    def take(self, count: int) -> list[int]:
        out: list[int] = []
        while len(out) < count:
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            step = min(count - len(out), self.size - self.position)
            out += self._order[self.position : self.position + step].tolist()
            self.position += step
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["size"] != self.size:
            raise ValueError(
                f"the checkpoint's data has {state['size']} items, this run's {self.size}: "
                "resume with the same data"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._make_order()
