"""Every module of the package imports on its own, first, in a fresh process.

An import circle (``a`` imports ``b`` at module level, ``b`` imports ``a``) only fails
when one side is the first divrl module imported, so a test session that has already
imported the rest hides it. Each module here is imported in a forked child of a parent
that has loaded the third-party libraries divrl imports at module level but no divrl
module: the child sees a fresh ``divrl`` (as ``python -c "import divrl.x"`` would) at the
cost of a fork, not of a new interpreter importing torch again (~2 s each).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_modules(root: Path = ROOT / "divrl") -> list[str]:
    """``divrl.x.y`` for every ``.py`` file under ``root`` (packages as their name)."""
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def module_level_third_party(root: Path = ROOT / "divrl") -> list[str]:
    """The non-divrl modules imported at module level under ``root``, as ``module`` or
    ``module:name`` (a name taken from it: transformers and trl load those lazily, on
    first access, which would otherwise cost each child seconds)."""
    found: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.update(f"{node.module}:{a.name}" for a in node.names)
    return sorted(m for m in found if m.split(".")[0].split(":")[0] not in ("divrl", "__future__"))


def _preload(entry: str) -> None:
    module, _, name = entry.partition(":")
    # an optional extra that is not installed fails here; the child importing it reports it
    with contextlib.suppress(Exception):
        loaded = importlib.import_module(module)
        if name:
            getattr(loaded, name)


def _import_in_child(module: str, write: int) -> int:
    """Import ``module``; on failure write the traceback's end to ``write``; exit code."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # an optional extra (vllm, verl) that is not installed is not a circle
        if (exc.name or "").split(".")[0] != "divrl":
            return 0
        os.write(write, traceback.format_exc().encode()[-4000:])
        return 1
    except BaseException:
        os.write(write, traceback.format_exc().encode()[-4000:])
        return 1
    return 0


def import_alone(modules: list[str], preload: list[str]) -> dict[str, str]:
    """Import each of ``modules`` in its own forked child (as many at once as there are
    CPUs); ``{module: traceback}`` of the ones that fail. Must run in a process that has
    imported no divrl module."""
    assert not any(m == "divrl" or m.startswith("divrl.") for m in sys.modules)
    for entry in preload:
        _preload(entry)
    failures: dict[str, str] = {}
    running: dict[int, tuple[str, int]] = {}  # pid -> (module, read end of its pipe)
    pending = list(modules)
    while pending or running:
        while pending and len(running) < (os.cpu_count() or 1):
            module = pending.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: import, report, leave without running atexit hooks
                os.close(read)
                os._exit(_import_in_child(module, write))
            os.close(write)
            running[pid] = (module, read)
        pid, status = os.wait()
        module, read = running.pop(pid)
        with os.fdopen(read, "rb") as pipe:  # a report is at most 4 kB: never blocks
            report = pipe.read().decode()
        if status != 0:
            failures[module] = report or f"exit status {status}"
    return failures


def test_every_module_imports_on_its_own():
    # a subprocess, because this test session has imported divrl already
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_import_each_module import import_alone, module_level_third_party, package_modules
        print(json.dumps(import_alone(package_modules(), module_level_third_party())))
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failures, "modules that fail to import on their own:\n" + "\n".join(
        f"--- {m}\n{tb}" for m, tb in failures.items()
    )


def test_a_circle_is_caught(tmp_path):
    """Two modules importing each other at module level fail when either comes first."""
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circ.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from circ.a import A\nB = 2\n")
    (pkg / "c.py").write_text("C = 3\n")
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_import_each_module import import_alone
        print(json.dumps(import_alone(["circ.a", "circ.b", "circ.c"], [])))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)

    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(failures) == ["circ.a", "circ.b"]
    assert "circular import" in failures["circ.a"]
