"""The doc tables that list registry entries are the generated ones
(``python scripts/registry_tables.py``), so a new divergence, loss, engine, profile or
world is documented by running that command, not by editing pages by hand."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "registry_tables.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_committed_tables_are_the_generated_ones():
    out = _run("--check")
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_registry_has_a_table_in_the_docs():
    text = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    spec = importlib.util.spec_from_file_location("registry_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {"divergences", "advantage_estimators", "policy_losses"} <= set(module.TABLES)
    for name in module.TABLES:
        assert f"<!-- registry: {name} -->" in text, name


def test_a_stale_table_is_reported_and_rewritten(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "page.md"
    page.write_text("Intro.\n\n<!-- registry: divergences -->\n| old |\n<!-- /registry -->\nEnd.\n")
    out = _run("--check", "--docs", str(docs))
    assert out.returncode == 1 and "stale registry tables in docs/page.md" in out.stdout
    assert "| old |" in page.read_text()  # --check writes nothing
    assert _run("--docs", str(docs)).returncode == 0
    text = page.read_text()
    assert text.startswith("Intro.\n\n<!-- registry: divergences -->\n| name |")
    assert (
        "| `js` |" in text and "| old |" not in text and text.endswith("<!-- /registry -->\nEnd.\n")
    )
    assert _run("--check", "--docs", str(docs)).returncode == 0
