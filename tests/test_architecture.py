"""The project's structure rules, checked on the source tree's AST.

- no file under ``divrl/``, ``experiments/`` or ``benchmarks/`` over 600 lines;
- no function over 80 lines of code (its docstring not counted; nested functions count
  towards their own length, and towards their parent's as lines of it);
- ``divrl/training/trainer.py`` (the loop) no longer than 300 lines;
- no module imports from a higher layer, lazy (function-level) imports included. Layers,
  lowest first: algorithms, rewards, rollout, fileio -> data, runs -> training, evaluation
  -> integrations -> toy -> commands, cli, pipeline, experiments, benchmarks. Every
  top-level module or package of ``divrl`` must have a layer, so none goes unchecked.

Known offenders that other work is splitting are listed in :data:`PENDING`; the lead
empties it as those changes merge. A stale entry fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("divrl", "experiments", "benchmarks")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
#: issue 17: the loop reads in one sitting; its stages live in their own modules
TRAINER = "divrl/training/trainer.py"
MAX_TRAINER_LINES = 300

#: top-level package or ``divrl`` sub-package -> layer (a module may import its own layer
#: and the ones below, never a higher one)
LAYERS: dict[str, int] = {
    "divrl": 0,  # the package root (version only)
    "divrl.algorithms": 0,
    "divrl.rewards": 0,
    "divrl.rollout": 0,
    "divrl.fileio": 0,  # writing files whole; imports nothing from divrl, any layer may use it
    "divrl.distributed": 0,  # reductions over processes, the process group's end
    "divrl.profiles": 0,  # benchmark profiles: hooks by data source, imported lazily
    "divrl.provenance": 0,  # where a result came from: commit, versions, threads, machine
    "divrl.data": 1,
    "divrl.runs": 1,  # the run-directory layout, below training and evaluation
    "divrl.checkpoint": 1,  # checkpoint formats and export, beside the run layout
    "divrl.training": 2,
    "divrl.evaluation": 2,
    "divrl.integrations": 3,
    "divrl.toy": 4,
    "divrl.commands": 5,
    "divrl.cli": 5,
    "divrl.pipeline": 5,
    "experiments": 5,
    "benchmarks": 5,
}

#: Known offenders being fixed elsewhere (issue 17's training-step split): remove each entry
#: when its change lands. Keys: ``size:<file>``, ``function:<file>:<qualified name>``,
#: ``import:<file> -> <module>``.
PENDING: set[str] = set()


def _source_files() -> list[Path]:
    files: list[Path] = []
    for d in SOURCE_DIRS:
        files += sorted((ROOT / d).rglob("*.py")) if (ROOT / d).is_dir() else []
    return files


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_name(path: Path) -> str:
    return _module_name_in(ROOT, path)


def _module_name_in(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int | None:
    """The layer of a project module (None: not a project module)."""
    parts = module.split(".")
    for n in (2, 1):
        key = ".".join(parts[:n])
        if key in LAYERS and (n == 2 or parts[0] != "divrl" or len(parts) == 1):
            return LAYERS[key]
    return None


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines the function spans, its decorators and docstring not counted."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from _functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module imported anywhere in the file (module level or inside functions)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.add(target)
            # ``from divrl import toy`` imports the sub-package divrl.toy
            out.update(f"{target}.{alias.name}" for alias in node.names if target == "divrl")
    return out


def violations() -> dict[str, str]:
    """Every rule broken in the tree: key (see :data:`PENDING`) -> what is wrong."""
    found: dict[str, str] = {}
    for path in _source_files():
        rel, text = _rel(path), path.read_text()
        n_lines = len(text.splitlines())
        if n_lines > MAX_FILE_LINES:
            found[f"size:{rel}"] = f"{n_lines} lines > {MAX_FILE_LINES}"
        if rel == TRAINER and n_lines > MAX_TRAINER_LINES:
            found[f"size:{rel}"] = f"{n_lines} lines > {MAX_TRAINER_LINES} (the loop only)"
        tree = ast.parse(text, filename=rel)
        for name, node in _functions(tree):
            n = _function_lines(node)
            if n > MAX_FUNCTION_LINES:
                found[f"function:{rel}:{name}"] = f"{n} lines > {MAX_FUNCTION_LINES}"
        module = _module_name(path)
        own = _layer(module)
        if own is None:
            continue
        for target in sorted(_imports(tree, module, path.name == "__init__.py")):
            layer = _layer(target)
            if layer is not None and layer > own:
                found[f"import:{rel} -> {target}"] = f"layer {own} imports layer {layer}"
    return found


@pytest.fixture(scope="module")
def found() -> dict[str, str]:
    return violations()


def test_no_new_violations(found):
    new = {k: v for k, v in found.items() if k not in PENDING}
    assert not new, "structure rules broken:\n" + "\n".join(f"  {k}: {v}" for k, v in new.items())


def test_pending_offenders_are_still_offenders(found):
    stale = sorted(PENDING - set(found))
    assert not stale, f"fixed, remove from PENDING in {__file__}: {stale}"


def top_level_modules(package: Path) -> list[str]:
    """``divrl.<x>`` for every module file and sub-package directly in ``package``."""
    names = []
    for path in sorted(package.iterdir()):
        if path.suffix == ".py" and path.name != "__init__.py":
            names.append(f"{package.name}.{path.stem}")
        elif path.is_dir() and (path / "__init__.py").is_file():
            names.append(f"{package.name}.{path.name}")
    return names


def test_every_top_level_module_has_a_layer():
    missing = [m for m in top_level_modules(ROOT / "divrl") if m not in LAYERS]
    assert not missing, f"add these to LAYERS in {__file__} (and docs/architecture.md): {missing}"


def private_imports(tree: ast.AST) -> list[str]:
    """``module._name`` for each private name a file imports from a project module (a
    private name is its module's own; another module that needs it needs a public one)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _layer(node.module) is not None:
            out += [
                f"{node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return out


def test_no_private_name_is_imported_from_another_module():
    found = {
        _rel(path): names
        for path in _source_files()
        if (names := private_imports(ast.parse(path.read_text())))
    }
    assert not found, f"private names imported across modules: {found}"
    caught = private_imports(ast.parse("from divrl.toy.world import _row, ok\n"))
    assert caught == ["divrl.toy.world._row"]


def import_graph(files: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports, lazy (in-function) imports included;
    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module."""
    names = {_module_name_in(root, f): f for f in files}
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                edges.update(f"{node.module}.{a.name}" for a in node.names)
        edges |= _imports(ast.parse(path.read_text()), module, path.name == "__init__.py")
        graph[module] = {e for e in edges if e in names and e != module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round a circle (strongly connected
    components of more than one module), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return circles


def test_no_import_circle_lazy_imports_included():
    """A lazy import that closes a circle still ties the modules together (each needs the
    other to work); the package is free of them, and stays so."""
    files = [f for f in _source_files() if _rel(f).startswith("divrl/")]
    assert import_circles(import_graph(files)) == []


def test_the_circle_check_finds_a_lazy_circle(tmp_path):
    pkg = tmp_path / "divrl"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    from divrl.b import g\n")
    (pkg / "b.py").write_text("from divrl import c\n")
    (pkg / "c.py").write_text("import divrl.a\n")
    (pkg / "d.py").write_text("from divrl import a\n")  # imports into the circle, not in it
    circles = import_circles(import_graph(sorted(pkg.glob("*.py")), tmp_path))
    assert circles == [["divrl.a", "divrl.b", "divrl.c"]]


DOC = ROOT / "docs" / "architecture.md"


def doc_layers(text: str) -> dict[str, int]:
    """``module -> layer`` from the "## Layers" table of docs/architecture.md (a row: ``|
    N | `a`, `b` | what it is |``)."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    found: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for name in re.findall(r"`([\w.]+)`", cells[1]):
                found[name] = int(cells[0])
    return found


def test_the_doc_layer_table_is_the_tests():
    doc = doc_layers(DOC.read_text())
    wrong = {m: (doc.get(m), n) for m, n in LAYERS.items() if doc.get(m) != n}
    extra = sorted(set(doc) - set(LAYERS))
    assert not wrong and not extra, (
        f"docs/architecture.md's layer table differs from LAYERS: (doc, test) {wrong}; "
        f"in the doc only: {extra}"
    )


def test_the_doc_table_parser_reads_rows():
    text = "## Layers\n\n| layer | m | w |\n|---|---|---|\n| 0 | `divrl.a`, `b` | x |\n## Next\n| 9 | `c` | y |"
    assert doc_layers(text) == {"divrl.a": 0, "b": 0}


def test_the_checks_catch_what_they_look_for(tmp_path):
    """Each rule on a hand-made case, so that a check that finds nothing is not vacuous."""
    long_fn = "def f():\n    '''doc\n    more doc'''\n" + "    x = 1\n" * 80
    (node,) = [n for _, n in _functions(ast.parse(long_fn))]
    assert _function_lines(node) == 81  # the def line and 80 statements, not the docstring
    assert _layer("divrl.toy.world") == 4 and _layer("divrl.training") == 2
    assert _layer("divrl.pipeline") == 5 and _layer("experiments.reproduce") == 5
    assert _layer("divrl") == 0 and _layer("torch.nn") is None and _layer("divrl.runs") == 1
    lazy = "def g():\n    from divrl.toy import world\n    from . import sibling\n"
    assert _imports(ast.parse(lazy), "divrl.training.trainer", False) == {
        "divrl.toy",
        "divrl.training",
    }
    assert "divrl.toy" in _imports(ast.parse("from divrl import toy\n"), "divrl.data", False)
    assert _layer("divrl.fileio") == 0
    # a new top-level module is listed, so the layer test above would name it
    (tmp_path / "divrl").mkdir()
    (tmp_path / "divrl" / "__init__.py").write_text("")
    (tmp_path / "divrl" / "newmod.py").write_text("")
    (tmp_path / "divrl" / "newpkg").mkdir()
    (tmp_path / "divrl" / "newpkg" / "__init__.py").write_text("")
    assert top_level_modules(tmp_path / "divrl") == ["divrl.newmod", "divrl.newpkg"]
    assert _layer("divrl.newmod") is None
