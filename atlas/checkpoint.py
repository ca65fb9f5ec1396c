"""Checkpoints: one folder per step, written atomically, with a `latest` pointer.

    {output_dir}/checkpoints/step-000030/
        reader/             Hugging Face T5 folder (safetensors) + the reader tokenizer
        retriever/          query/ (and passage/ when untied) HF encoder folders + retriever.json
        config.yaml         the fully resolved run config
        training_state.pt   both optimizers and schedulers, RNG states, step, data position
    {output_dir}/checkpoints/latest   the name of the newest complete checkpoint

`training_state.pt` holds only tensors and plain Python values, so it loads with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

from atlas.config import AtlasConfig, load_config, save_config
from tasks.io import atomic_directory, atomic_write_text

STATE_FILE = "training_state.pt"


def checkpoint_root(output_dir: str | Path) -> Path:
    """The folder holding a run's checkpoints."""
    return Path(output_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    """The RNG states that make a resumed run continue bit-identically (Python and torch CPU)."""
    state = {"python": list(_flatten(random.getstate())), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _flatten(python_state) -> list:
    version, internal, gauss = python_state
    return [version, *internal, gauss]


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured."""
    flat = state["python"]
    random.setstate((flat[0], tuple(int(x) for x in flat[1:-1]), flat[-1]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output_dir: str | Path, step: int, *, model, config: AtlasConfig,
                    training_state: dict[str, Any], keep_last: int = 2) -> Path:
    """Write checkpoint `step` atomically, point `latest` at it and keep only the newest `keep_last`.

    `training_state`: optimizer/scheduler state dicts, data position, step — plain values and tensors.
    """
    root = checkpoint_root(output_dir)
    final = root / f"step-{step:06d}"
    with atomic_directory(final, overwrite=True) as tmp:
        model.reader.save_pretrained(tmp / "reader")
        model.reader_tokenizer.save_pretrained(str(tmp / "reader"))
        if model.retriever is not None:
            model.retriever.save_pretrained(tmp / "retriever")
        save_config(config, tmp / "config.yaml")
        torch.save({**training_state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    atomic_write_text(root / "latest", final.name + "\n")
    if keep_last > 0:
        for old in sorted(root.glob("step-*"))[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from itself, a run's output folder, or its `checkpoints/` folder."""
    path = Path(path)
    for root in (path, path / "checkpoints"):
        if (root / "latest").is_file():
            return root / (root / "latest").read_text().strip()
    if (path / "config.yaml").is_file() and (path / "reader").is_dir():
        return path
    raise FileNotFoundError(
        f"{path}: no checkpoint here (expected a checkpoint folder with reader/ and config.yaml, "
        "or a run folder with checkpoints/latest)"
    )


def load_training_state(checkpoint: str | Path) -> dict[str, Any]:
    """The training state of a checkpoint folder (weights_only: no pickled code runs)."""
    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=True)


def checkpoint_config(checkpoint: str | Path, overrides: list[str] = ()) -> AtlasConfig:
    """The config a checkpoint was trained with, plus optional overrides."""
    return load_config(Path(checkpoint) / "config.yaml", list(overrides))
