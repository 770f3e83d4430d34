"""Importing one of divrl's verl modules before verl itself registers everything.

verl's ``__init__`` loads the ``verl.plugins`` entry points, and divrl's plugin imports the
loss and trainer modules. When a user's first import is one of those modules (``from
divrl.integrations.verl.losses import DivRLLoss``), verl starts while that module is still
half-executed, so the plugin must not need names from it. Each case runs in a fresh
interpreter: only there is the order real.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import divrl.integrations.verl as verl_pkg

PACKAGE = Path(verl_pkg.__file__).parent

CHECK = """
{first}
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
assert "divrl_vanilla" in POLICY_LOSS_REGISTRY, sorted(POLICY_LOSS_REGISTRY)
assert "divrl_sync" in TRAINER_REGISTRY, sorted(TRAINER_REGISTRY)
print("registered")
"""


def _imports_verl(path: Path) -> bool:
    """Whether the module imports verl at its top level (what starts verl's plugin loading)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
            return True
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "verl" for a in node.names):
            return True
    return False


VERL_MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if _imports_verl(p))


def test_the_modules_that_import_verl_are_found():
    assert {"losses", "rehearsal", "trainer"} <= set(VERL_MODULES)


def _run_first(first: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parents[2]), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", CHECK.format(first=first)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


@pytest.mark.parametrize("name", VERL_MODULES)
def test_a_module_imported_before_verl_leaves_the_plugin_registered(name):
    first = f"import divrl.integrations.verl.{name}"
    if name == "losses":  # the line a user writes
        first = "from divrl.integrations.verl.losses import DivRLLoss"
    result = _run_first(first)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "registered" in result.stdout
    assert "is not registered" not in result.stderr, result.stderr[-3000:]
