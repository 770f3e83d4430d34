"""The rehearsal controller in the TRL adapter: DPH-RL's eta set each optimiser step from a
target (:mod:`divrl.algorithms.rehearsal_control`, the same options and rule as
``algorithm.rehearsal_control`` in ``divrl train``).

TRL runs the optimiser step inside transformers' loop, so the controller closes a step
when the first micro-batch of the next one begins (``state.global_step`` changed): the
measurements of the step's micro-batches (already averaged over processes, so every
process holds the same eta) are averaged into ``m_t``. Its state, with the measurements of
the step in progress, is kept in ``TrainerState.stateful_callbacks`` under
:data:`STATE_KEY`, which transformers writes into every checkpoint's
``trainer_state.json`` and reads back on ``train(resume_from_checkpoint=...)``: a resumed
run continues with the same eta.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from divrl.algorithms.rehearsal_control import (
    RehearsalController,
    RehearsalControlOptions,
    control_measurement,
)

__all__ = ["STATE_KEY", "TrlRehearsalControl"]

#: the controller's entry in ``TrainerState.stateful_callbacks``
STATE_KEY = "DivRLRehearsalControl"


class TrlRehearsalControl:
    """The controller, fed with the DPH term's metrics of each micro-batch.

    Args:
        options: validated controller options.
        eta: the starting eta (``divergence_coef``).
    """

    def __init__(self, options: RehearsalControlOptions, eta: float) -> None:
        self.controller = RehearsalController(options, eta)
        self.step: int | None = None  # the optimiser step the pending measurements belong to
        self.pending: list[float] = []
        self._restored = False

    @property
    def eta(self) -> float:
        return self.controller.eta

    def begin(self, state: Any) -> None:
        """Before a micro-batch's DPH term: restore a resumed run's state (once), and close
        the previous optimiser step if this micro-batch starts a new one."""
        if not self._restored:
            self._restored = True
            saved = (state.stateful_callbacks or {}).get(STATE_KEY)
            if saved is not None and state.global_step > 0:
                self.load_state_dict(saved)
        if self.step is not None and state.global_step != self.step and self.pending:
            self.controller.update(sum(self.pending) / len(self.pending))
            self.pending = []
        self.step = state.global_step

    def record(self, metrics: Mapping[str, float], state: Any) -> dict[str, float]:
        """Take a micro-batch's (process-averaged) DPH metrics; keep the state where the
        next checkpoint saves it; return what to log."""
        options = self.controller.options
        measured = control_measurement(options.measure, metrics)
        if measured is not None:
            self.pending.append(measured)
        if state.stateful_callbacks is None:
            state.stateful_callbacks = {}
        state.stateful_callbacks[STATE_KEY] = self.state_dict()
        return {
            "dph/eta": self.controller.eta,
            "dph/control_target": options.target,
            "dph/eta_at_bound": float(self.controller.at_bound),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "controller": self.controller.state_dict(),
            "step": self.step,
            "pending": list(self.pending),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.controller.load_state_dict(state["controller"])
        self.step = state["step"]
        self.pending = [float(v) for v in state["pending"]]
