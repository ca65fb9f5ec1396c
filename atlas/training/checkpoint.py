"""Checkpoints: one folder per step, written atomically, with a `latest` pointer.

    {output_dir}/checkpoints/step-000030/
        reader/             Hugging Face T5 folder (safetensors) + the reader tokenizer
        retriever/          query/ (and passage/ when untied) HF encoder folders + retriever.json
        config.yaml         the fully resolved run config
        training_state.pt   both optimizers and schedulers, RNG states, step, data position,
                            the world size and the global batch it was trained with
    {output_dir}/checkpoints/latest   the name of the newest complete checkpoint

`training.keep_last` checkpoints are kept (0: all). `training_state.pt` is the largest part of one:
AdamW keeps two moments per trained weight (twice the trained weights' size in fp32), which only
`--resume` reads; `atlas evaluate`, `ask` and `serve` read the weights alone, so a finished run's
state files may be deleted. `disk_report` measures a run folder (`atlas train` prints it).

`training_state.pt` holds only tensors and plain Python values, so it loads with
`torch.load(weights_only=True)`. Its reader optimizer state is a plain torch AdamW state dict
whether or not the run used DeepSpeed (ZeRO's partitions are gathered before saving), so a
checkpoint resumes at any world size, with or without DeepSpeed.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from atlas.config import AtlasConfig, config_to_dict, load_config, save_config
from atlas.loading import resolve_checkpoint
from common.io import atomic_directory, atomic_write_text

logger = logging.getLogger(__name__)

STATE_FILE = "training_state.pt"


def checkpoint_root(output_dir: str | Path) -> Path:
    """The folder holding a run's checkpoints."""
    return Path(output_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    """The RNG states that make a resumed run continue bit-identically (Python and torch CPU)."""
    version, internal, gauss = random.getstate()
    state = {"python": [version, *internal, gauss], "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured."""
    flat = state["python"]
    random.setstate((flat[0], tuple(int(x) for x in flat[1:-1]), flat[-1]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    model,
    config: AtlasConfig,
    training_state: dict[str, Any],
    keep_last: int = 2,
    reader_weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write checkpoint `step` atomically, point `latest` at it and keep only the newest `keep_last`.

    `training_state`: optimizer/scheduler state dicts, data position, step — plain values and tensors.
    `reader_weights`: the reader's full T5 state dict when the module holds only a partition
    of it (DeepSpeed ZeRO-3, gathered by the caller); by default the module's own weights.
    """
    root = checkpoint_root(output_dir)
    final = root / f"step-{step:06d}"
    with atomic_directory(final, overwrite=True) as tmp:
        if reader_weights is None:
            model.reader.save_pretrained(tmp / "reader")
        else:
            model.reader.seq2seq.save_pretrained(
                str(tmp / "reader"), state_dict=reader_weights, safe_serialization=True
            )
        model.reader_tokenizer.save_pretrained(str(tmp / "reader"))
        if model.retriever is not None:
            model.retriever.save_pretrained(tmp / "retriever")
        save_config(config, tmp / "config.yaml")
        torch.save({**training_state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    atomic_write_text(root / "latest", final.name + "\n")
    if keep_last > 0:
        for old in sorted(root.glob("step-*"))[:-keep_last]:
            if old != final:  # the checkpoint just written is the newest of this run, whatever its number
                shutil.rmtree(old, ignore_errors=True)
    return final


def folder_bytes(path: str | Path) -> int:
    """Bytes of the regular files under `path` (or of `path` itself), links not followed."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def megabytes(n_bytes: int) -> str:
    """`n_bytes` as "288 MB" (MB = 10^6 bytes; "0.4 MB" below 1 MB)."""
    mb = n_bytes / 1e6
    return f"{mb:.0f} MB" if mb >= 1 else f"{mb:.1f} MB"


def disk_report(output_dir: str | Path, checkpoint: str | Path, *, keep_last: int) -> dict[str, Any]:
    """What a run folder holds on disk after a checkpoint was written: → {"checkpoint": path,
    "checkpoint_bytes", "weights_bytes" (all but the training state: reader/, retriever/, config.yaml),
    "training_state_bytes",
    "checkpoints_kept", "keep_last", "run_folder_bytes", "message"}; `message` is the sentence
    `atlas train` prints."""
    checkpoint = Path(checkpoint)
    state = folder_bytes(checkpoint / STATE_FILE) if (checkpoint / STATE_FILE).is_file() else 0
    total = folder_bytes(checkpoint)
    kept = len(list(checkpoint_root(output_dir).glob("step-*")))
    run_total = folder_bytes(output_dir)
    keeps = "every checkpoint" if keep_last <= 0 else f"the newest {keep_last}"
    message = (
        f"wrote {checkpoint} ({megabytes(total)}, of which {STATE_FILE} {megabytes(state)}: the optimizer "
        f"state, read only by --resume; delete it once the run is final). training.keep_last={keep_last} "
        f"keeps {keeps}: {kept} checkpoint(s) now; {output_dir} holds {megabytes(run_total)} in all"
    )
    return {
        "checkpoint": str(checkpoint),
        "checkpoint_bytes": total,
        "weights_bytes": total - state,
        "training_state_bytes": state,
        "checkpoints_kept": kept,
        "keep_last": keep_last,
        "run_folder_bytes": run_total,
        "message": message,
    }


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def config_differences(old: AtlasConfig, new: AtlasConfig) -> list[str]:
    """The dotted keys whose values differ between two configs, as "key: old → new"."""
    a, b = _flat(config_to_dict(old)), _flat(config_to_dict(new))
    return [
        f"{key}: {a.get(key)!r} → {b.get(key)!r}" for key in sorted(a.keys() | b.keys()) if a.get(key) != b.get(key)
    ]


def claim_run_folder(config: AtlasConfig, *, overwrite: bool = False, resume_same: bool = True) -> Path | None:
    """Make `training.output_dir` this run's, never silently replacing another: → the checkpoint to resume from
    when the folder holds a run of the same config (`resume_same`), else None (a new run).

    A folder holding a run of another config is refused (`FileExistsError` naming the differing keys) unless
    `overwrite`, which deletes the folder first. A folder with no run in it is used as it is."""
    out = Path(config.training.output_dir)
    saved = out / "config.yaml"
    has_run = saved.is_file() or (out / "checkpoints").is_dir()
    if not has_run:
        return None
    if overwrite:
        logger.info("--overwrite: deleting the run in %s", out)
        shutil.rmtree(out)
        return None
    differences = config_differences(load_config(saved, check_data=False), config) if saved.is_file() else ["?"]
    if differences or not resume_same:
        shown = "; ".join(differences[:6]) + (f"; … ({len(differences)} keys)" if len(differences) > 6 else "")
        why = f"its config differs ({shown})" if differences and differences != ["?"] else "it is not this run"
        raise FileExistsError(
            f"{out} holds another training run ({why}); choose another training.output_dir, continue that run "
            f"with `atlas train --resume {out}`, or replace it with --overwrite"
        )
    try:
        return resolve_checkpoint(out)
    except FileNotFoundError:  # the same run, stopped before its first checkpoint: it starts again
        return None


def load_training_state(checkpoint: str | Path) -> dict[str, Any]:
    """The training state of a checkpoint folder (weights_only: no pickled code runs)."""
    path = Path(checkpoint) / STATE_FILE
    if not path.is_file():  # e.g. a run made by `atlas import`: weights and config, no optimizer state
        raise FileNotFoundError(
            f"{path}: no training state, so this checkpoint cannot be resumed; start a new run from its "
            f"weights instead: atlas train {Path(checkpoint) / 'config.yaml'} training.output_dir=DIR …"
        )
    return torch.load(path, map_location="cpu", weights_only=True)


def global_batch_size(batch_size: int, accumulation_steps: int, world_size: int) -> int:
    """Examples per optimizer step: per-rank batch × accumulation steps × ranks."""
    return batch_size * accumulation_steps * world_size


def per_rank_batch_size(global_batch: int, accumulation_steps: int, world_size: int) -> int:
    """The per-rank batch that keeps `global_batch` examples per optimizer step on `world_size`
    ranks with `accumulation_steps` micro-batches; ValueError when it does not divide."""
    share = accumulation_steps * world_size
    if global_batch % share:
        raise ValueError(
            f"cannot keep the checkpoint's global batch of {global_batch} examples on {world_size} rank(s) "
            f"× {accumulation_steps} accumulation step(s): {global_batch} is not divisible by {share}; "
            f"resume on a number of ranks that divides {global_batch // accumulation_steps}"
        )
    return global_batch // share


def config_for_world_size(config: AtlasConfig, state: dict[str, Any], world_size: int) -> AtlasConfig:
    """The checkpoint's config with `training.batch_size` set so that a resumed run on
    `world_size` ranks keeps the global batch it was trained with (same data order, same
    examples per optimizer step); `accumulation_steps` stays. Checkpoints written before the
    global batch was stored keep their per-rank batch."""
    t = config.training
    if "global_batch" not in state:
        return config
    batch = per_rank_batch_size(int(state["global_batch"]), t.accumulation_steps, world_size)
    if batch != t.batch_size:
        logger.info(
            "resuming on %d rank(s) instead of %d: per-rank batch %d → %d (global batch %d)",
            world_size,
            state.get("world_size", "?"),
            t.batch_size,
            batch,
            state["global_batch"],
        )
        config = dataclasses.replace(config, training=dataclasses.replace(t, batch_size=batch))
    return config
