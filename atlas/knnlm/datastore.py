"""Token-level datastore for kNN-LM: keys (hidden states) → values (the next token).

A datastore is a folder:

    manifest.json          n_rows, key dims, producer metadata, complete flag
    progress.json          rows committed so far (rewritten atomically after each chunk)
    values.npy             int32 (N,)      row r holds token t+1 for the key at position t
    keys-{name}.npy        float16 (N, d)  one file per key type (several captured in one pass)
    lm_logprobs.npy        float32 (N,)    optional: log p_LM(value | context) of the producer

Rows follow sliding windows over a token stream (`sliding_windows`); every target token is
scored exactly once, with at least `context - stride` tokens of left context after the first
window. Building is resumable: arrays are preallocated `.npy` memmaps, committed in whole
batches, and a rerun skips the batches already committed. Batches are aligned to fixed window
boundaries, so a resumed build computes exactly the same batches as an uninterrupted one and
the files come out byte-identical.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.io import atomic_write_json
from common.json_fields import JsonFields, read_json
from common.progress import progress_bar as tqdm

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
# (keys {name: (B, T, d)}, lm_logprobs (B, T) or None) for token windows (B, T) and targets (B, T).
Producer = Callable[[np.ndarray, np.ndarray], tuple[dict[str, np.ndarray], np.ndarray | None]]


@dataclass
class DatastoreManifest:
    """A datastore's `manifest.json`: its rows, the dimension of each key type, whether it holds the producer's
    log-probs, the producer's metadata (`lm.producer_meta`), and whether the build finished. The only code that
    knows the file's keys; read through `common.json_fields`, as the index's and the corpus's manifests are."""

    n_rows: int
    key_dims: dict[str, int]
    with_lm_logprobs: bool
    meta: dict[str, Any]
    complete: bool = False

    @classmethod
    def load(cls, folder: str | os.PathLike) -> DatastoreManifest:
        """The manifest of the datastore folder `folder`: FileNotFoundError where there is none, ValueError naming
        the file and the field where one is missing or wrong (bad input: a ValueError, as every error of a file)."""
        path = Path(folder) / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no datastore manifest (was the build finished?)")
        return cls.from_json(read_json(path, ValueError, "datastore manifest"), path)

    def save(self, folder: str | os.PathLike) -> None:
        """Atomically replace the folder's `manifest.json`."""
        atomic_write_json(Path(folder) / MANIFEST, self.to_json())

    @classmethod
    def from_json(cls, data: Any, where: Path) -> DatastoreManifest:
        """A manifest from its parsed JSON `data`, read from the file `where` (named in errors)."""
        fields = JsonFields(data, where, error=ValueError)
        key_dims = fields.get("key_dims", dict)
        dims = fields.object("key_dims")
        return cls(
            n_rows=fields.count("n_rows"),
            key_dims={name: dims.count(name) for name in key_dims},
            with_lm_logprobs=fields.get("with_lm_logprobs", bool),
            meta=fields.get("meta", dict),
            complete=fields.get("complete", bool),
        )

    def to_json(self) -> dict:
        """The manifest as `manifest.json` holds it."""
        return {
            "n_rows": self.n_rows,
            "key_dims": self.key_dims,
            "with_lm_logprobs": self.with_lm_logprobs,
            "meta": self.meta,
            "complete": self.complete,
        }


def key_file_name(key_name: str) -> str:
    """File name of one key type; ':' (as in 'ffn_input:-1') is not portable in file names."""
    return "keys-" + key_name.replace(":", "@") + ".npy"


def sliding_windows(n_tokens: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows (begin, end, first_scored) covering rows 0 … n_tokens-2 once each.

    Input positions begin … end-1 are fed to the model; rows first_scored … end-1 (key at
    position t, value token t+1) are kept. The first window scores all its positions, each
    later one the `stride` newest.
    """
    if context < 1 or not 1 <= stride <= context:
        raise ValueError(f"need context >= 1 and 1 <= stride <= context, got context={context} stride={stride}")
    n_rows = n_tokens - 1
    if n_rows < 1:
        return []
    end = min(context, n_rows)
    windows = [(0, end, 0)]
    while end < n_rows:
        new_end = min(end + stride, n_rows)
        windows.append((max(0, new_end - context), new_end, end))
        end = new_end
    return windows


# Metadata that says what produced the keys: two stores can be searched against each other (or
# one resumed) only when these agree. Written by `atlas.knnlm.lm.build_datastore`.
PRODUCER_FIELDS = ("architecture", "model_fingerprint", "tokenizer_fingerprint", "encoder_input_ids")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_differences(old: dict, new: dict, fields: list[str]) -> str:
    """'meta.text: stored 'a', now 'b'; …' for the differing fields (one level into dicts)."""
    parts = []
    for name in fields:
        a, b = old.get(name), new.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    parts.append(f"{name}.{key}: stored {_short(a.get(key))}, now {_short(b.get(key))}")
        else:
            parts.append(f"{name}: stored {_short(a)}, now {_short(b)}")
    return "; ".join(parts)


def check_same_producer(query_store: Datastore, datastore: Datastore) -> None:
    """Refuse to search `datastore` with keys from a different model, tokenizer or prompt.

    Compares `PRODUCER_FIELDS` of the two manifests' metadata; stores whose producer recorded
    none of them (generic producers) are accepted, one-sided records are refused.
    """
    a, b = query_store.manifest.meta, datastore.manifest.meta
    recorded = [f for f in PRODUCER_FIELDS if f in a or f in b]
    differing = [f for f in recorded if a.get(f) != b.get(f)]
    if differing:
        details = "; ".join(
            f"{f}: {_short(a.get(f, '(not recorded)'))} vs {_short(b.get(f, '(not recorded)'))}" for f in differing
        )
        raise ValueError(
            f"query store {query_store.path} and datastore {datastore.path} were built by "
            f"different producers ({details}); rebuild the query store with the datastore's model"
        )


class Datastore:
    """Read access to a complete datastore folder (arrays opened as read-only memmaps)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = DatastoreManifest.load(self.path)
        if not self.manifest.complete:
            raise ValueError(f"{self.path / MANIFEST}: datastore build is incomplete; rerun the build to resume it")

    def __len__(self) -> int:
        return self.manifest.n_rows

    @property
    def key_names(self) -> list[str]:
        """Key types stored in this datastore."""
        return list(self.manifest.key_dims)

    @property
    def values(self) -> np.ndarray:
        """int32 (N,) next-token ids."""
        return np.load(self.path / "values.npy", mmap_mode="r")

    def keys(self, key_name: str) -> np.ndarray:
        """float16 (N, d) keys of one type; ValueError names the stored types."""
        if key_name not in self.manifest.key_dims:
            raise ValueError(f"{self.path}: key '{key_name}' not stored; stored keys: {self.key_names}")
        return np.load(self.path / key_file_name(key_name), mmap_mode="r")

    @property
    def lm_logprobs(self) -> np.ndarray:
        """float32 (N,) log p_LM(value) recorded by the producer."""
        if not self.manifest.with_lm_logprobs:
            raise ValueError(f"{self.path}: built without LM log-probs")
        return np.load(self.path / "lm_logprobs.npy", mmap_mode="r")


class DatastoreWriter:
    """Creates (or reopens, to resume) the preallocated arrays of a datastore folder."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_rows: int,
        key_dims: dict[str, int],
        with_lm_logprobs: bool,
        meta: dict[str, Any],
    ):
        self.path = Path(path)
        self.n_rows = n_rows
        self.key_dims = dict(key_dims)
        self.manifest = DatastoreManifest(n_rows, self.key_dims, with_lm_logprobs, meta)
        self.path.mkdir(parents=True, exist_ok=True)
        manifest_path = self.path / MANIFEST
        if manifest_path.exists():
            old = DatastoreManifest.load(self.path)
            wanted, found = self.manifest.to_json(), old.to_json()
            mismatched = [f for f in ("n_rows", "key_dims", "with_lm_logprobs", "meta") if found[f] != wanted[f]]
            if mismatched:
                raise ValueError(
                    f"{manifest_path}: an existing datastore differs in {mismatched} "
                    f"({describe_differences(found, wanted, mismatched)}); "
                    "use a new folder or delete this one"
                )
            self.manifest = old
            mode = "r+"
            self.n_done = (
                int(json.loads((self.path / PROGRESS).read_text())["n_done"]) if (self.path / PROGRESS).exists() else 0
            )
        else:
            mode = "w+"
            self.n_done = 0
        self.values = self._open("values.npy", mode, np.int32, (n_rows,))
        self.keys = {
            name: self._open(key_file_name(name), mode, np.float16, (n_rows, dim))
            for name, dim in self.key_dims.items()
        }
        self.lm_logprobs = self._open("lm_logprobs.npy", mode, np.float32, (n_rows,)) if with_lm_logprobs else None
        if mode == "w+":
            self.manifest.save(self.path)
            self.commit(0)

    def _open(self, name: str, mode: str, dtype, shape) -> np.ndarray:
        if mode == "w+":
            return np.lib.format.open_memmap(self.path / name, mode="w+", dtype=dtype, shape=shape)
        array = np.lib.format.open_memmap(self.path / name, mode="r+")
        if array.dtype != dtype or array.shape != shape:
            raise ValueError(
                f"{self.path / name}: expected {np.dtype(dtype)} {shape}, found {array.dtype} {array.shape}"
            )
        return array

    @property
    def complete(self) -> bool:
        """True once finish() has run."""
        return self.manifest.complete

    def write(
        self,
        start: int,
        keys: dict[str, np.ndarray],
        values: np.ndarray,
        lm_logprobs: np.ndarray | None,
    ) -> None:
        """Write rows start … start+n-1: keys {name: (n, d)}, values (n,), lm_logprobs (n,)."""
        stop = start + len(values)
        self.values[start:stop] = values
        for name, array in keys.items():
            self.keys[name][start:stop] = array
        if self.lm_logprobs is not None:
            self.lm_logprobs[start:stop] = lm_logprobs

    def commit(self, n_done: int) -> None:
        """Flush the arrays, then record that rows < n_done are final (that order is crash-safe)."""
        for array in [self.values, *self.keys.values()] + ([self.lm_logprobs] if self.lm_logprobs is not None else []):
            array.flush()
        self.n_done = n_done
        atomic_write_json(self.path / PROGRESS, {"n_done": n_done, "n_rows": self.n_rows})

    def finish(self) -> Datastore:
        """Mark the datastore complete and return a reader for it."""
        self.commit(self.n_done)
        self.manifest.complete = True
        self.manifest.save(self.path)
        return Datastore(self.path)


def fill_datastore(
    writer: DatastoreWriter,
    token_ids: np.ndarray,
    producer: Producer,
    *,
    context: int,
    stride: int,
    batch_size: int,
    progress: bool = True,
) -> Datastore:
    """Run `producer` over sliding windows of `token_ids` (N,) into `writer`, resuming if stopped.

    producer(windows (B, T) int64, targets (B, T) int64) returns keys {name: (B, T, d)} and
    log p(target) (B, T) or None. Commits after every batch of `batch_size` windows.
    """
    token_ids = np.asarray(token_ids, dtype=np.int64)
    if writer.n_rows != len(token_ids) - 1:
        raise ValueError(f"{writer.path}: datastore has {writer.n_rows} rows but the text gives {len(token_ids) - 1}")
    if writer.complete:
        return Datastore(writer.path)
    windows = sliding_windows(len(token_ids), context, stride)
    batches = [windows[i : i + batch_size] for i in range(0, len(windows), batch_size)]
    bar = tqdm(
        total=writer.n_rows,
        initial=writer.n_done,
        unit="tok",
        desc=f"datastore {writer.path.name}",
        disable=not progress,
        mininterval=5.0,
    )
    for batch in batches:
        if batch[-1][1] <= writer.n_done:
            continue
        # Windows of one batch share a length except when the text is shorter than `context`.
        length = batch[0][1] - batch[0][0]
        if any(end - begin != length for begin, end, _ in batch):
            raise AssertionError("sliding windows of unequal length in one batch")
        inputs = np.stack([token_ids[begin:end] for begin, end, _ in batch])
        targets = np.stack([token_ids[begin + 1 : end + 1] for begin, end, _ in batch])
        keys, logprobs = producer(inputs, targets)
        for row, (begin, end, first) in enumerate(batch):
            part = slice(first - begin, end - begin)
            writer.write(
                first,
                {name: array[row, part] for name, array in keys.items()},
                targets[row, part].astype(np.int32),
                None if logprobs is None else logprobs[row, part],
            )
        writer.commit(batch[-1][1])
        bar.update(batch[-1][1] - batch[0][2])
    bar.close()
    return writer.finish()
