"""The verl plugin's tests: run in the ``divrl[verl]`` environment (``make test-verl``).

``make test`` does not collect this folder (pyproject's ``testpaths``), and the core
environment has no verl.
"""

import pytest

verl = pytest.importorskip("verl", reason="the verl extra is not installed (make test-verl)")


@pytest.fixture
def main_ppo(monkeypatch):
    """verl's main_ppo with what would start Ray and the workers replaced by a record
    (``main_ppo.started`` lists which of them a call reached)."""
    import ray
    from verl.trainer import main_ppo

    started = []
    monkeypatch.setattr(main_ppo, "run_ppo", lambda *a, **k: started.append("run_ppo"))
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append("ray.init"))
    main_ppo.started = started
    return main_ppo
