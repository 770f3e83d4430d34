"""Where a result came from: the code, the packages, the machine, the config and the data.

Every file divrl writes that holds a number someone may publish (a training run's
``provenance.json``, an evaluation's ``eval_config.json`` and ``summary.json``, a reference
store's ``manifest.json``, an experiment's summary, a report) records :func:`provenance`:

- ``git``: ``{"commit", "dirty"}`` of the checkout divrl was imported from (``dirty``:
  tracked files differ from the commit), or ``None`` when divrl is not run from a git
  checkout (an installed wheel) or git is missing: never an error;
- ``versions``: divrl's, Python's, and those of torch, transformers, accelerate, numpy and
  whichever of trl, verl and vllm are installed (a package that is not installed is left
  out); an imported module's ``__version__`` wins over the installed metadata;
- ``config_hash``: :func:`config_hash` of the resolved config (``None`` when not given);
- ``data``: the data's fingerprint (:mod:`divrl.data.fingerprint`, computed by the
  writer, which knows its data);
- ``engine``: the rollout engine;
- ``threads``: ``torch.get_num_threads()`` and the thread variables of the environment
  (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``), which change the
  order of floating-point sums and so the last digits;
- ``device`` (``cpu`` or the CUDA device's name) and ``cpu`` (the processor's model name);
- ``host`` and ``time`` (seconds since the epoch).

It is cheap: git runs once per process and checkout (cached), the versions come from the
already imported modules or the installed metadata (read once per process), and torch is
not imported here (the threads and device are read from torch only when the caller
imported it).

This module imports nothing from divrl but the version, so any layer may use it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "THREAD_VARIABLES",
    "config_hash",
    "cpu_model",
    "git_state",
    "package_versions",
    "provenance",
    "records_fingerprint",
]

#: the environment variables that set the math libraries' thread counts
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

#: packages whose version is recorded when installed
PACKAGES = ("torch", "transformers", "accelerate", "numpy", "trl", "verl", "vllm")

_SOURCE_ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=8)
def git_state(root: str | Path | None = None) -> dict[str, Any] | None:
    """``{"commit": <40 hex>, "dirty": bool}`` of the git checkout at ``root`` (default:
    the one divrl is imported from), or None when it is not a checkout or git fails.
    Cached per ``root``: a process asks git once."""
    where = str(root if root is not None else _SOURCE_ROOT)
    try:
        top = _git(where, "rev-parse", "--show-toplevel")
        if root is None and Path(top).resolve() != _SOURCE_ROOT:
            return None  # divrl installed inside some other repository: not its code
        commit = _git(where, "rev-parse", "HEAD")
        status = _git(where, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status)}


def _git(where: str, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", where, *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
        env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # a status must not write the index
    )
    return done.stdout.strip()


def package_versions() -> dict[str, str]:
    """divrl's and Python's versions and those of :data:`PACKAGES` that are installed."""
    from divrl import __version__

    out = {"divrl": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if version is None:
            version = _installed_version(name)
        if version is not None:
            out[name] = str(version)
    return out


@functools.cache
def _installed_version(name: str) -> str | None:
    """The installed distribution's version (cached: the metadata scan is the slow part)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else the platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _threads_and_device() -> tuple[dict[str, Any], str | None]:
    threads: dict[str, Any] = {v: os.environ.get(v) for v in THREAD_VARIABLES}
    torch = sys.modules.get("torch")
    device = None
    if torch is not None and hasattr(torch, "get_num_threads"):
        threads["torch"] = torch.get_num_threads()
        threads["torch_interop"] = torch.get_num_interop_threads()
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_available():
            device = f"cuda ({cuda.get_device_name(cuda.current_device())})"
        else:
            device = "cpu"
    return threads, device


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON: {type(obj).__name__}")


def config_hash(config: Any) -> str:
    """``sha256:<hex>`` of a config (a dataclass or a mapping) as canonical JSON: keys
    sorted, tuples as lists, so a config read back from its file hashes the same."""
    text = json.dumps(
        _plain(config) if dataclasses.is_dataclass(config) else config,
        sort_keys=True,
        default=_plain,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def records_fingerprint(records: Any) -> str:
    """``sha256:<hex>`` of a sequence of JSON-able records, in their order (an evaluation's
    prompts: their order is the order of its results)."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, default=str).encode() + b"\n")
    return "sha256:" + digest.hexdigest()


def provenance(
    *,
    config: Any = None,
    data: str | None = None,
    engine: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The provenance record described in the module docstring; ``extra`` keys are added
    as they are (e.g. ``data_path``)."""
    threads, device = _threads_and_device()
    return {
        "git": git_state(),
        "versions": package_versions(),
        "config_hash": None if config is None else config_hash(config),
        "data": data,
        "engine": engine,
        "threads": threads,
        "device": device,
        "cpu": cpu_model(),
        "host": socket.gethostname(),
        "time": time.time(),
        **extra,
    }
