"""Content fingerprints: what an index was built with, so it is never searched with something else.

A fingerprint is a hex SHA-256 over a canonical serialisation: tensors by name, dtype, shape
and bytes (so the same weights give the same hash whatever file they came from); a
tokenizer by its full serialised vocabulary and rules; settings as sorted JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def hash_state_dict(state_dict: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of the tensors of a state dict, in sorted name order (device-independent)."""
    import torch  # here: `hash_file` serves the corpus, which needs no torch

    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        # bytes of the raw storage; view as uint8 because bf16 has no numpy dtype
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def hash_tokenizer(tokenizer) -> str:
    """SHA-256 of a tokenizer's behaviour: the fast backend's JSON, else its sorted vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # truncation/padding are call-time state that encoding mutates, not the tokenizer's rules
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None)
        spec.pop("padding", None)
        payload = json.dumps(spec, sort_keys=True)
    else:
        payload = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def hash_json(obj) -> str:
    """SHA-256 of a JSON-serialisable object in canonical (sorted, compact) form."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def hash_file(path: str | os.PathLike, *, block_size: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes, read in blocks (bounded memory)."""
    digest = hashlib.sha256()
    with open(Path(path), "rb") as f:
        while block := f.read(block_size):
            digest.update(block)
    return digest.hexdigest()
