"""Cheap fingerprints of a model directory and of a prompt set.

They let a DPH-RL reference store (``divrl presample``) be checked against the model and
the data a training run uses, without hashing gigabytes of weights:

- :func:`model_fingerprint` of a local model directory hashes the full bytes of
  ``config.json``, ``generation_config.json`` and every tokenizer file, and, for each
  weight file (``*.safetensors``, ``*.bin``, ``*.pt``), its name, its size and its first
  and last 1 MiB: 2 MiB read per weight file, whatever its size. A safetensors file starts
  with its header (every tensor's name, dtype, shape and offsets), so a change of
  architecture, dtype or shapes is always caught, and so is training that changes the
  tensors stored at either end of the file (full fine-tuning does); a change confined to
  tensors in the middle of a file larger than 2 MiB is not. Modification times are not
  used: a copied model is the same model. A name that is not a local directory (a hub id)
  is fingerprinted by the name.
- :func:`prompts_fingerprint` hashes every prompt's id and token ids, in any order (the
  token ids cover the text, the template and the tokenizer).
- :func:`prompt_key` hashes one prompt as the data file writes it (text or messages),
  recorded per prompt in the store for datasets without divrl's ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SAMPLE_BYTES", "model_fingerprint", "prompt_key", "prompts_fingerprint"]

#: bytes hashed at each end of a weight file
SAMPLE_BYTES = 1 << 20

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_TEXT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def _hash_file_ends(digest, path: Path) -> None:
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}".encode())
    with path.open("rb") as f:
        digest.update(f.read(SAMPLE_BYTES))
        if size > 2 * SAMPLE_BYTES:
            f.seek(size - SAMPLE_BYTES)
            digest.update(f.read(SAMPLE_BYTES))
        elif size > SAMPLE_BYTES:
            digest.update(f.read())


def model_fingerprint(path: str | Path) -> str:
    """``sha256:<hex>`` of a local model directory (see the module docstring for what is
    read), or ``name:<path>`` for a name that is not a local directory (a hub id)."""
    root = Path(path)
    if not root.is_dir():
        return f"name:{path}"
    digest = hashlib.sha256()
    for name in _TEXT_FILES:
        file = root / name
        if file.is_file():
            digest.update(name.encode())
            digest.update(file.read_bytes())
    for file in sorted(p for p in root.iterdir() if p.suffix in _WEIGHT_SUFFIXES):
        _hash_file_ends(digest, file)
    return f"sha256:{digest.hexdigest()}"


def prompt_key(prompt: Any) -> str:
    """``sha256:<hex>`` of one prompt as its data file writes it, before any template: a
    string, or chat messages (only each message's ``role`` and ``content`` count). The
    reference store records it per prompt, so a dataset without divrl's ids (a TRL user's)
    finds its rows in the store by the prompt itself."""
    if isinstance(prompt, list | tuple):
        canonical: Any = [[str(m.get("role")), str(m.get("content"))] for m in prompt]
    else:
        canonical = str(prompt)
    text = json.dumps(canonical, ensure_ascii=False)
    return f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"


def prompts_fingerprint(prompts: Iterable[tuple[str, Sequence[int]]]) -> str:
    """``sha256:<hex>`` of the set of ``(prompt id, prompt token ids)`` pairs: their order
    does not count (a store does not depend on the order of the data file)."""
    rows = sorted(json.dumps([str(pid), [int(t) for t in ids]]) for pid, ids in prompts)
    digest = hashlib.sha256()
    for row in rows:
        digest.update(row.encode() + b"\n")
    return f"sha256:{digest.hexdigest()}"
