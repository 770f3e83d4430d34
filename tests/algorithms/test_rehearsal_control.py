"""The rehearsal controller on scripted measurements: it rises while the target is missed,
falls while it is held, stays within its bounds, waits out its warm-up and resumes exactly."""

import json
import math

import pytest

from divrl.algorithms import RehearsalController, RehearsalControlOptions, control_measurement


def _controller(**options):
    return RehearsalController(RehearsalControlOptions(**options), eta=0.2)


def test_rises_when_missed_and_falls_when_held():
    c = _controller(target=0.05, rate=0.1, warmup_steps=0)
    # missed by 100 percent or more: the full rate, eta x exp(0.1)
    assert c.update(0.10) == pytest.approx(0.2 * math.exp(0.1))
    assert c.update(0.30) == pytest.approx(0.2 * math.exp(0.2))
    # missed by 20 percent: a fifth of the rate
    assert c.update(0.06) == pytest.approx(0.2 * math.exp(0.2 + 0.02))
    # held exactly: unchanged
    assert c.update(0.05) == pytest.approx(0.2 * math.exp(0.22))
    # held with room: falls; a gain in likelihood (negative loss) falls at the full rate
    assert c.update(0.025) == pytest.approx(0.2 * math.exp(0.22 - 0.05))
    assert c.update(-0.3) == pytest.approx(0.2 * math.exp(0.22 - 0.15))


def test_stays_within_its_bounds_and_says_so():
    c = _controller(target=0.05, rate=0.5, warmup_steps=0, min_scale=0.1, max_scale=4.0)
    for _ in range(20):  # a target out of reach: eta climbs to the upper bound and stays
        c.update(1.0)
        assert 0.02 <= c.eta <= 0.8
    assert c.eta == pytest.approx(0.8) and c.at_bound == 1
    for _ in range(20):  # a target held without rehearsal: down to the lower bound
        c.update(0.0)
    assert c.eta == pytest.approx(0.02) and c.at_bound == -1
    c.update(0.05)
    assert c.at_bound == -1 and c.eta == pytest.approx(0.02)


def test_warm_up_and_missing_measurements_leave_eta_alone():
    c = _controller(target=0.05, warmup_steps=3)
    for m in (1.0, 1.0, 1.0):
        assert c.update(m) == 0.2
    assert c.update(None) == 0.2 and c.update(float("nan")) == 0.2
    assert c.steps == 3  # a step without a measurement does not count
    assert c.update(1.0) > 0.2


def test_resumes_exactly_from_its_state():
    script = [0.01, 0.2, 0.07, 0.04, -0.02, 0.5, 0.049, 0.051, 0.3, 0.0]
    whole = _controller(target=0.05, warmup_steps=2)
    expected = [whole.update(m) for m in script]
    first = _controller(target=0.05, warmup_steps=2)
    got = [first.update(m) for m in script[:4]]
    state = json.loads(json.dumps(first.state_dict()))  # as the checkpoint stores it
    second = _controller(target=0.05, warmup_steps=2)
    second.load_state_dict(state)
    got += [second.update(m) for m in script[4:]]
    assert got == expected  # bitwise
    assert second.state_dict() == whole.state_dict()


def test_a_saved_eta_outside_the_bounds_is_refused():
    c = _controller(max_scale=2.0)
    with pytest.raises(ValueError, match="outside this run's bounds"):
        c.load_state_dict({"eta": 1.0, "steps": 3, "measured": 0.1})


def test_observe_reads_the_measure_and_logs_what_it_used():
    c = _controller(target=0.05, warmup_steps=0)
    logged = c.observe({"dph/log_u_mean": -0.1, "dph/divergence": 0.3})
    assert logged["dph/eta"] == 0.2
    assert logged["dph/control_likelihood"] == pytest.approx(0.1)
    assert logged["dph/control_target"] == 0.05
    assert logged["dph/eta_next"] == pytest.approx(0.2 * math.exp(0.1)) == c.eta
    d = _controller(measure="divergence", target=0.3, warmup_steps=0)
    assert d.observe({"dph/log_u_mean": -0.1, "dph/divergence": 0.3})["dph/eta_next"] == 0.2
    assert control_measurement("likelihood", {}) is None


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"target": 0}, "target=0.0 must be > 0"),
        ({"measure": "kl"}, "measure='kl': one of likelihood, divergence"),
        ({"min_scale": 2.0}, r"min_scale=2.0 must be in \[1e-06, 1\]"),
        ({"max_scale": 0.5}, r"max_scale=0.5 must be in \[1, 1e\+06\]"),
        ({"warmup_steps": 1.5}, "warmup_steps=1.5 must be an integer"),
        ({"rate": "fast"}, "rate='fast' must be a number"),
        ({"traget": 0.1}, "unknown option.*traget.*known: measure, target"),
    ],
)
def test_bad_options_are_refused_with_one_line(raw, message):
    with pytest.raises(ValueError, match=message):
        RehearsalControlOptions.from_mapping(raw)


def test_off_when_empty():
    assert RehearsalControlOptions.from_mapping({}) is None
    assert RehearsalControlOptions.from_mapping(None) is None


def test_a_huge_rate_is_clipped_before_exp_and_tiny_bounds_are_refused():
    c = _controller(target=0.05, rate=1000.0, warmup_steps=0, min_scale=1e-6, max_scale=1e6)
    assert c.update(1.0) == pytest.approx(0.2 * 1e6) and c.at_bound == 1  # exp(1000) overflows
    assert c.update(0.0) == pytest.approx(0.2 * 1e-6) and c.at_bound == -1
    assert c.update(0.0) == pytest.approx(0.2 * 1e-6) and c.eta > 0  # never 0: log(eta) holds
    with pytest.raises(ValueError, match=r"min_scale=1e-30 must be in \[1e-06, 1\]"):
        RehearsalControlOptions.from_mapping({"min_scale": 1e-30})
    with pytest.raises(ValueError, match=r"bounds .* must be positive, finite numbers"):
        RehearsalController(RehearsalControlOptions(min_scale=1e-6), eta=1e-305)


def test_a_saved_eta_outside_new_bounds_says_which_scale_to_set():
    c = _controller(min_scale=0.5)
    with pytest.raises(ValueError, match=r"set algorithm.rehearsal_control.min_scale <= 0.25,"):
        c.load_state_dict({"eta": 0.05, "steps": 3, "measured": 0.1})
