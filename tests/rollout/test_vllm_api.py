"""The vLLM names divrl's engine uses: listed (divrl.rollout.vllm.VLLM_API), the list
checked against a vLLM source by scripts/vllm_api_check.py without importing vLLM, and the
pyproject range equal to the engine's supported versions."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import tomllib
from pathlib import Path

import pytest

from divrl.rollout.vllm import SUPPORTED_VERSIONS, VLLM_API

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_api_check.py"
#: a vLLM wheel or a folder holding vllm/ to check the list against (else the installed vllm)
SOURCE_ENV = "DIVRL_VLLM_SOURCE"


def _script():
    spec = importlib.util.spec_from_file_location("vllm_api_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _listed(kind: str, where: str) -> set[str]:
    return {n for k, w, names in VLLM_API if (k, w) == (kind, where) for n in names}


def test_pyproject_range_is_the_engines_supported_versions():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    low, high = SUPPORTED_VERSIONS
    expected = f"vllm>={'.'.join(map(str, low))},<{'.'.join(map(str, high[:2]))}"
    assert extras["optional-dependencies"]["vllm"] == [expected]


def test_every_vllm_name_the_engine_uses_is_listed():
    tree = ast.parse((ROOT / "divrl" / "rollout" / "vllm.py").read_text())
    calls = {"LLM": set(), "VSamplingParams": set(), "TokensPrompt": set()}
    llm_methods, completion = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in calls:
                calls[name].update(k.arg for k in node.keywords if k.arg)
            if (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Attribute)
                and f.value.attr == "llm"
            ):
                llm_methods.add(f.attr)
                calls["LLM"].update(k.arg for k in node.keywords if k.arg)
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "completion":
            completion.add(node.attr)
    assert calls["LLM"] and calls["VSamplingParams"] and llm_methods and completion
    assert calls["LLM"] <= _listed("fields", "LLM") | _listed("fields", "EngineArgs") | {
        "args"  # collective_rpc's
    }
    assert calls["VSamplingParams"] <= _listed("fields", "SamplingParams")
    assert calls["TokensPrompt"] <= _listed("fields", "TokensPrompt")
    assert llm_methods <= _listed("methods", "LLM")
    assert completion <= _listed("fields", "CompletionOutput")


def _fake_vllm(root: Path, drop: tuple[str, str, str] | None = None) -> Path:
    """A vllm package that defines exactly VLLM_API (less ``drop``: kind, where, name)."""
    package = root / "vllm"
    package.mkdir(parents=True)
    classes, modules = [], {}
    for kind, where, names in VLLM_API:
        names = [n for n in names if (kind, where, n) != drop]
        if kind == "exports":
            modules[where] = names
        elif kind == "literal":
            (package / where).mkdir(parents=True, exist_ok=True)
            (package / where / "values.py").write_text(f"VALUES = {names!r}\n")
        elif kind == "fields":
            classes.append(f"class {where}:\n" + "".join(f"    {n}: int\n" for n in names))
        else:
            classes.append(
                f"class {where}:\n" + "".join(f"    def {n}(self): ...\n" for n in names)
            )
    (package / "defs.py").write_text("\n".join(classes) + "\n" + "class _Pad: ...\n")
    for module, names in modules.items():
        path = package.joinpath(*module.split(".")[1:], "__init__.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"__all__ = {names!r}\n")
    return package


def test_the_check_names_a_name_that_disappeared(tmp_path):
    check = _script()
    assert check.missing_names(_fake_vllm(tmp_path / "all"), VLLM_API) == []
    for drop in (
        ("fields", "SamplingParams", "logprobs"),
        ("methods", "LLM", "collective_rpc"),
        ("fields", "EngineArgs", "worker_extension_cls"),
        ("literal", "config", "processed_logprobs"),
        ("exports", "vllm.inputs", "TokensPrompt"),
    ):
        package = _fake_vllm(tmp_path / "_".join(drop), drop)
        assert check.missing_names(package, VLLM_API) == [f"{drop[0]} {drop[1]}.{drop[2]}"]


def test_a_real_vllm_defines_every_name(tmp_path):
    """Against ``$DIVRL_VLLM_SOURCE`` (a wheel from ``pip download 'vllm==X' --no-deps``
    or an unpacked one) or the installed vLLM; skipped where there is neither."""
    check = _script()
    source = os.environ.get(SOURCE_ENV)
    if source:
        arg = ["--wheel", source] if source.endswith(".whl") else ["--source", source]
    elif importlib.util.find_spec("vllm") is not None:
        arg = []
    else:
        pytest.skip(f"no vLLM here: set {SOURCE_ENV} to a vLLM wheel to run this check")
    assert check.main(arg) == 0
    if source and re.search(r"vllm-(\d+)\.(\d+)", source):
        version = tuple(int(x) for x in re.search(r"vllm-(\d+)\.(\d+)", source).groups())
        assert SUPPORTED_VERSIONS[0][:2] <= version < SUPPORTED_VERSIONS[1][:2]
