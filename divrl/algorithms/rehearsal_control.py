"""A rehearsal controller for DPH-RL: the divergence weight eta set each step from a target.

A fixed eta means a different pull on another model, batch layout or GPU count (the
``authors`` weighting alone scales it by the layout). The controller instead holds a target
a user can state without knowing any of that, and moves eta multiplicatively toward it:

- ``measure: likelihood`` (the default): ``m_t = -mean_tokens(log u)`` on the step's
  reference samples, ``log u = log pi_theta - log pi_ref``: how many nats per token the
  initial policy's own correct responses lost since the start (``dph/log_u_mean``, already
  computed by the divergence term: no extra cost). Target ``delta``: "the reference
  responses may lose at most delta nats per token".
- ``measure: divergence``: ``m_t`` = the step's divergence estimate (``dph/divergence``,
  in the units of the chosen divergence). Target ``D``.

The update (``e_t`` the relative miss, clipped; eta moves in log space)::

    e_t = clip((m_t - target) / target, -1, 1)
    log eta_{t+1} = clip(log eta_t + rate * e_t, log(eta_0 min_scale), log(eta_0 max_scale))

for ``t >= warmup_steps`` (before that eta stays ``eta_0``, the configured coefficient).
eta rises while the target is missed (``m_t > target``) and falls while it is held, by at
most a factor ``exp(rate)`` per step; it settles where ``m_t = target``. A target that
cannot be reached leaves eta at its upper bound (``at_bound = +1``), one that is held
without any rehearsal at its lower bound (``-1``). A non-finite or missing measurement
(a step without reference samples) leaves eta unchanged.

Pure Python: no torch, no I/O. The state (:meth:`RehearsalController.state_dict`) is a
dict of plain numbers, saved in checkpoints so that a resumed run continues exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CONTROL_MEASURES",
    "RehearsalControlOptions",
    "RehearsalController",
    "control_measurement",
]

#: what the controller holds -> the step metric it reads and the sign that turns it into
#: the measured quantity (a loss of likelihood is ``-log u``)
CONTROL_MEASURES: dict[str, tuple[str, float]] = {
    "likelihood": ("dph/log_u_mean", -1.0),
    "divergence": ("dph/divergence", 1.0),
}


#: the bounds' widest multiples of the configured eta: 1e6 either way is 138 steps at
#: ``rate`` 0.1, and keeps eta a normal positive float for any configured eta > 1e-290
MIN_SCALE_LOWEST = 1e-6
MAX_SCALE_HIGHEST = 1e6


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RehearsalControlOptions:
    """The controller's options, validated once (``ValueError`` naming the option)."""

    measure: str = _opt(
        "likelihood",
        "what is held: 'likelihood': the reference responses' loss of log-likelihood, "
        "nats per token (-mean log u); 'divergence': the divergence estimate",
    )
    target: float = _opt(
        0.02,
        "the most the measure may reach: nats per token for 'likelihood', the divergence's "
        "own units for 'divergence'",
    )
    rate: float = _opt(0.1, "the largest change of log eta in one step (0.1: 10.5 percent)")
    warmup_steps: int = _opt(10, "steps at the configured eta before the controller moves it")
    min_scale: float = _opt(
        0.01, "eta's lower bound, a multiple of the configured eta (in [1e-6, 1])"
    )
    max_scale: float = _opt(
        100.0, "eta's upper bound, a multiple of the configured eta (in [1, 1e6])"
    )

    def __post_init__(self) -> None:
        if self.measure not in CONTROL_MEASURES:
            raise ValueError(
                f"rehearsal_control.measure={self.measure!r}: one of {', '.join(CONTROL_MEASURES)}"
            )
        checks = {
            "target": self.target > 0,
            "rate": self.rate > 0,
            "warmup_steps": self.warmup_steps >= 0,
            "min_scale": MIN_SCALE_LOWEST <= self.min_scale <= 1,
            "max_scale": 1 <= self.max_scale <= MAX_SCALE_HIGHEST,
        }
        need = {
            "target": "> 0",
            "rate": "> 0",
            "warmup_steps": ">= 0",
            "min_scale": f"in [{MIN_SCALE_LOWEST:g}, 1]",
            "max_scale": f"in [1, {MAX_SCALE_HIGHEST:g}]",
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not ok or not math.isfinite(float(value)):
                raise ValueError(f"rehearsal_control.{name}={value!r} must be {need[name]}")

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> RehearsalControlOptions | None:
        """Options from a config mapping (``None`` or ``{}``: the controller is off); an
        unknown key is an error that lists the known ones."""
        if not raw:
            return None
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise ValueError(
                f"rehearsal_control: unknown option(s) {', '.join(unknown)}; "
                f"known: {', '.join(names)}"
            )
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                continue
            value, kind = raw[f.name], type(f.default)
            if kind is float and isinstance(value, str):
                with contextlib.suppress(ValueError):  # YAML 1.1 reads `1e-3` as a string
                    value = float(value)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if kind is not str and not (number and (kind is float or isinstance(value, int))):
                raise ValueError(
                    f"rehearsal_control.{f.name}={value!r} must be {'an integer' if kind is int else 'a number'}"
                )
            if kind is str and not isinstance(value, str):
                raise ValueError(f"rehearsal_control.{f.name}={value!r} must be a string")
            kwargs[f.name] = kind(value)
        return cls(**kwargs)

    def as_dict(self) -> dict[str, Any]:
        """Every option with the value it runs with."""
        return dataclasses.asdict(self)


def control_measurement(measure: str, metrics: Mapping[str, float]) -> float | None:
    """The measured quantity ``m_t`` from a step's metrics (None: not measured this step)."""
    key, sign = CONTROL_MEASURES[measure]
    value = metrics.get(key)
    if value is None or not math.isfinite(float(value)):
        return None
    return sign * float(value)


class RehearsalController:
    """eta of the DPH-RL divergence term, moved each step toward the target (module docs).

    Args:
        options: the controller's options.
        eta: the configured divergence coefficient ``eta_0`` (> 0): the start and the
            reference for the bounds.
    """

    def __init__(self, options: RehearsalControlOptions, eta: float) -> None:
        if not (eta > 0 and math.isfinite(eta)):
            raise ValueError(
                f"the rehearsal controller needs a divergence coefficient > 0, got {eta}"
            )
        low, high = eta * options.min_scale, eta * options.max_scale
        if not (low >= sys.float_info.min and math.isfinite(high)):
            raise ValueError(
                f"the rehearsal controller's bounds [{low}, {high}] (divergence_coef {eta} "
                "times min_scale and max_scale) must be positive, finite numbers: raise "
                "algorithm.divergence_coef or narrow the scales"
            )
        self.options = options
        self.initial_eta = float(eta)
        self.eta = float(eta)
        self.steps = 0  # measurements received (warm-up counts them)
        self.measured = math.nan  # the last measurement (NaN: none yet)

    @property
    def bounds(self) -> tuple[float, float]:
        o = self.options
        return self.initial_eta * o.min_scale, self.initial_eta * o.max_scale

    @property
    def at_bound(self) -> int:
        """+1 at the upper bound (target out of reach), -1 at the lower, 0 between."""
        low, high = self.bounds
        return 1 if self.eta >= high else (-1 if self.eta <= low else 0)

    def update(self, measured: float | None) -> float:
        """Take the step's measurement ``m_t`` and return eta for the next step."""
        if measured is None or not math.isfinite(measured):
            return self.eta
        o = self.options
        self.measured = float(measured)
        self.steps += 1
        if self.steps <= o.warmup_steps:
            return self.eta
        error = min(1.0, max(-1.0, (self.measured - o.target) / o.target))
        low, high = self.bounds
        # clipped in log space, before exp: a large rate cannot overflow
        log_eta = math.log(self.eta) + o.rate * error
        if log_eta >= math.log(high):
            self.eta = high
        elif log_eta <= math.log(low):
            self.eta = low
        else:
            self.eta = min(high, max(low, math.exp(log_eta)))
        return self.eta

    def observe(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Read the step's measurement from its (process-reduced) metrics, update, and
        return what to log: ``dph/eta`` (the eta the step trained with), the measurement,
        the target, the next eta and whether it sits at a bound."""
        used = self.eta
        measured = control_measurement(self.options.measure, metrics)
        self.update(measured)
        return {
            "dph/eta": used,
            f"dph/control_{self.options.measure}": math.nan if measured is None else measured,
            "dph/control_target": self.options.target,
            "dph/eta_next": self.eta,
            "dph/eta_at_bound": float(self.at_bound),
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain numbers (JSON-safe): restore with :meth:`load_state_dict`."""
        return {
            "eta": self.eta,
            "initial_eta": self.initial_eta,
            "steps": self.steps,
            "measured": None if math.isnan(self.measured) else self.measured,
            "options": self.options.as_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state. The bounds stay those of this run's configured eta
        and options; a saved eta outside them is refused."""
        eta = float(state["eta"])
        low, high = self.bounds
        if not low <= eta <= high:
            scale = eta / self.initial_eta
            need = f"min_scale <= {scale:.6g}" if eta < low else f"max_scale >= {scale:.6g}"
            raise ValueError(
                f"the saved rehearsal controller eta {eta:.6g} is outside this run's bounds "
                f"[{low:.6g}, {high:.6g}] (divergence_coef {self.initial_eta:g} times "
                f"min_scale and max_scale): set algorithm.rehearsal_control.{need}, or "
                "resume with the run's own divergence_coef and scales (its config.yaml)"
            )
        self.eta = eta
        self.steps = int(state["steps"])
        measured = state.get("measured")
        self.measured = math.nan if measured is None else float(measured)
