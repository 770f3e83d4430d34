"""Check, before any ``from_pretrained``, that a model can be loaded at all.

``from_pretrained("some/id")`` without a network retries for tens of seconds and ends in a
long ``OSError``; a mistyped local path ends in "Repo id must be in the form ...". This
module answers in well under a second with one sentence that says what is missing:

- a path that exists is returned as is;
- a hub id already in the local hub cache is returned, and when the hub is unreachable the
  hub library is switched to offline mode (``HF_HUB_OFFLINE``) so that loading does not
  retry;
- anything else raises :class:`ModelSourceError` ("no local folder X and no network: ...").

It lives in the rollout layer so that evaluation, training and the commands can all call it.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["ModelSourceError", "check_model_source", "hub_reachable"]

# A hub repo id: ``name`` or ``owner/name`` (letters, digits, '-', '_', '.'), not a path.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


class ModelSourceError(FileNotFoundError):
    """The model is neither a local folder nor loadable from the hub (cache or network)."""


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub endpoint (``HF_ENDPOINT``) opens within ``timeout``."""
    url = urlparse(_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def _offline_requested() -> bool:
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in {"1", "true", "yes", "on"} for f in flags)


def _go_offline() -> None:
    """Make the hub library (and transformers through it) skip network calls from now on."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # already imported: it read the variable at import time
        constants.HF_HUB_OFFLINE = True


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return False
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def check_model_source(name_or_path: str | Path, *, timeout: float = 3.0) -> str:
    """Return ``name_or_path`` when a model can be loaded from it; raise otherwise.

    Args:
        name_or_path: a local model folder or a hub repo id (``owner/name``).
        timeout: seconds to wait for the hub before calling it unreachable.

    Raises:
        ModelSourceError: the path does not exist and it is not a hub id, or it is a hub id
            that is not in the local cache while the hub is unreachable or ``HF_HUB_OFFLINE``
            is set.
    """
    text = str(name_or_path)
    if Path(text).expanduser().exists():
        return text
    if not _REPO_ID.match(text) or ".." in text:
        raise ModelSourceError(
            f"no local folder {text}, and it is not a hub id (owner/name): check the path"
        )
    cached = _in_hub_cache(text)
    if _offline_requested():
        if cached:
            return text
        raise ModelSourceError(
            f"no local folder {text} and no network: HF_HUB_OFFLINE is set and {text} is not "
            "in the local hub cache; give a local model folder, or download it first "
            f"(`huggingface-cli download {text}` where there is a network)"
        )
    if hub_reachable(timeout):
        return text
    if cached:
        _go_offline()
        return text
    raise ModelSourceError(
        f"no local folder {text} and no network: {_endpoint()} did not answer within "
        f"{timeout:g} s and {text} is not in the local hub cache; give a local model folder, "
        f"or download it first (`huggingface-cli download {text}` where there is a network)"
    )
