"""Check that a vLLM release still defines every name divrl's vllm engine uses, by reading
its source (nothing of vLLM is imported or run, so no GPU is needed).

    python scripts/vllm_api_check.py --wheel vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python scripts/vllm_api_check.py --source DIR   # a folder holding vllm/ (an unpacked wheel)
    python scripts/vllm_api_check.py                # the installed vllm package's files

A wheel comes from ``pip download 'vllm==X' --no-deps -d DIR``. The names are
:data:`divrl.rollout.vllm.VLLM_API`; the script prints one line per missing name and exits
1 when one is missing, 0 when all are there.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return None


def _texts(package: Path) -> dict[Path, str]:
    return {
        path: path.read_text(encoding="utf-8", errors="replace")
        for path in sorted(package.rglob("*.py"))
    }


def _trees(texts: dict[Path, str], needle: str = "", under: Path | None = None):
    """The parsed files whose text holds ``needle``, at or under ``under``: parsing all of
    vLLM takes minutes, the files that can hold a name seconds."""
    out = {}
    for path, text in texts.items():
        if under is not None and path != under.with_suffix(".py") and under not in path.parents:
            continue
        if needle in text:
            tree = _parse(path)
            if tree is not None:
                out[path] = tree
    return out


def _classes(trees: dict[Path, ast.Module], name: str) -> list[ast.ClassDef]:
    return [
        node
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == name
    ]


def _class_names(cls: ast.ClassDef) -> set[str]:
    """Annotated fields, method names and parameters, ``self.<x> =`` targets of a class."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            args = node.args
            names.update(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
            for sub in ast.walk(node):
                targets = []
                if isinstance(sub, ast.Assign):
                    targets = sub.targets
                elif isinstance(sub, ast.AnnAssign):
                    targets = [sub.target]
                names.update(
                    t.attr
                    for t in targets
                    if isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                )
    return names


def _exports(package: Path, module: str) -> set[str]:
    base = package.joinpath(*module.split(".")[1:])
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    tree = _parse(path) if path.is_file() else None
    if tree is None:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __all__ entries and lazy-import tables
    return names


def _literals(package: Path, where: str, texts: dict[Path, str]) -> set[str]:
    return {
        n.value
        for tree in _trees(texts, under=package / where).values()
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def missing_names(package: Path, api) -> list[str]:
    """``kind where.name`` for each name of ``api`` the vLLM package at ``package`` lacks."""
    missing, texts = [], _texts(package)
    for kind, where, names in api:
        if kind == "exports":
            have = _exports(package, where)
        elif kind == "literal":
            have = _literals(package, where, texts)
        elif kind in ("fields", "methods"):
            trees = _trees(texts, needle=f"class {where}")
            have = set().union(*(_class_names(c) for c in _classes(trees, where)))
        else:
            raise ValueError(f"unknown kind {kind!r}")
        missing += [f"{kind} {where}.{name}" for name in names if name not in have]
    return missing


def _package(args: argparse.Namespace, scratch: Path) -> Path:
    if args.wheel:
        with zipfile.ZipFile(args.wheel) as wheel:
            wheel.extractall(scratch, [n for n in wheel.namelist() if n.endswith(".py")])
        return scratch / "vllm"
    if args.source:
        return Path(args.source) / "vllm"
    spec = importlib.util.find_spec("vllm")  # finds the files without importing vLLM
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vLLM is not installed here: give --wheel or --source")
    return Path(next(iter(spec.submodule_search_locations)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--wheel", type=Path, help="a vLLM wheel file")
    group.add_argument("--source", type=Path, help="a folder holding the vllm package")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from divrl.rollout.vllm import VLLM_API

    with tempfile.TemporaryDirectory() as scratch:
        package = _package(args, Path(scratch))
        if not (package / "__init__.py").is_file():
            raise SystemExit(f"{package}: no vllm package there")
        missing = missing_names(package, VLLM_API)
    for line in missing:
        print(f"missing: {line}")
    print(f"{len(missing)} of the names divrl's vllm engine uses are missing from {package}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
