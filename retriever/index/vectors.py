"""Passage vectors computed elsewhere: embed a corpus on GPUs (`atlas index embed`, under `torchrun`), build and
serve its index on a CPU machine (`atlas index build --vectors V`).

V is one `.npy` file of shape (N, d), or a folder of `.npy` shards whose rows, in file-name order, are the
corpus's rows in order; float16 or float32. Beside it an encoder record says which passage encoder made them
(`V.encoder.json` for a file, `V/encoder.json` for a folder): its fingerprint (what an index checks a query
encoder against), its source (a name, folder or hub id: what search loads by default), and the passage
format and length it embedded with. Vectors are checked before any index is built: their count against the
corpus's, their dimension against the encoder's, every row finite; the first fault is named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from common.io import atomic_write_json
from common.progress import progress_bar as tqdm

ENCODER_RECORD = "encoder.json"
COPY_ROWS = 65536  # rows checked and copied at a time: 48 MiB of float32 at d = 192, bounded at any N


@dataclass(frozen=True)
class EncoderRecord:
    """The passage encoder that made a set of vectors."""

    fingerprint: str
    dim: int
    source: str | None = None
    passage_format: str | None = None
    passage_maxlength: int | None = None
    embedding_precision: str = "fp32"  # what the vectors were embedded at (`retriever.index.embedding`)

    @classmethod
    def of(cls, retriever, source: str | None = None, precision: str = "fp32") -> EncoderRecord:
        """The record of a loaded `Retriever`'s passage side, embedding at `precision` ("fp32" or "bf16")."""
        return cls(
            fingerprint=retriever.passage_fingerprint(),
            dim=retriever.dim,
            source=source,
            passage_format=retriever.passage_format,
            passage_maxlength=retriever.passage_maxlength,
            embedding_precision=precision,
        )


def record_path(vectors: str | os.PathLike) -> Path:
    """Where the encoder record of the vectors at `vectors` lies."""
    vectors = Path(vectors)
    return vectors / ENCODER_RECORD if vectors.is_dir() else vectors.with_name(vectors.name + "." + ENCODER_RECORD)


def read_encoder_record(vectors: str | os.PathLike) -> EncoderRecord | None:
    """The encoder record beside `vectors`, or None where there is none; ValueError naming the file and field
    where it is malformed."""
    path = record_path(vectors)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    for field, kind in (("fingerprint", str), ("dim", int)):
        if not isinstance(data.get(field), kind):
            raise ValueError(f"{path}: field '{field}' is missing or not a {kind.__name__}")  # noqa: TRY004 (bad input)
    if data.get("embedding_precision", "fp32") not in ("fp32", "bf16"):
        raise ValueError(f"{path}: field 'embedding_precision' must be 'fp32' or 'bf16'")
    known = {"fingerprint", "dim", "source", "passage_format", "passage_maxlength", "embedding_precision"}
    return EncoderRecord(**{k: v for k, v in data.items() if k in known})


def write_encoder_record(vectors: str | os.PathLike, record: EncoderRecord) -> Path:
    path = record_path(vectors)
    atomic_write_json(path, asdict(record))
    return path


def vector_shards(vectors: str | os.PathLike) -> list[tuple[Path, np.ndarray]]:
    """The `.npy` files of `vectors` in row order, each memory-mapped (nothing read); ValueError naming a file
    that is not a 2-D float16/float32 array, or a folder with none."""
    vectors = Path(vectors)
    if not vectors.exists():
        raise FileNotFoundError(f"{vectors}: no such file or folder of vectors")
    files = sorted(vectors.glob("*.npy")) if vectors.is_dir() else [vectors]
    if not files:
        raise ValueError(f"{vectors}: a folder of vectors holds .npy shards; there are none")
    shards = []
    for path in files:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise ValueError(f"{path}: not a readable .npy array ({e})") from None
        if array.ndim != 2 or array.dtype not in (np.float16, np.float32):
            raise ValueError(
                f"{path}: vectors must be a 2-D float16 or float32 array; it is {array.dtype} {array.shape}"
            )
        shards.append((path, array))
    dims = {a.shape[1] for _, a in shards}
    if len(dims) > 1:
        raise ValueError(f"{vectors}: shards of different dimensions ({', '.join(map(str, sorted(dims)))})")
    return shards


def _blocks(shards: list[tuple[Path, np.ndarray]]) -> Iterator[tuple[Path, int, int, np.ndarray]]:
    """(file, its first row's position in the whole, the block's first row in the file, the block) in order.
    Read with plain file reads, not through the memory map: pages of a map that were read count in the
    process's resident memory until the kernel takes them back, which at 10M rows reads as gigabytes."""
    offset = 0
    for path, array in shards:
        rows, dim = array.shape
        with open(path, "rb") as f:
            f.seek(array.offset)  # np.load(mmap_mode="r") gives a memmap: where the data starts
            for start in range(0, rows, COPY_ROWS):
                count = min(COPY_ROWS, rows - start)
                block = np.fromfile(f, dtype=array.dtype, count=count * dim)
                if len(block) != count * dim:
                    raise ValueError(f"{path}: truncated ({start + len(block) // dim} of {rows} rows readable)")
                yield path, offset, start, block.reshape(count, dim)
        offset += rows


def write_float16_rows(path: Path, shape: tuple[int, int], blocks: Iterable[np.ndarray]) -> Path:
    """A (rows, d) float16 `.npy` at `path` (as `np.save` lays it out) from `blocks` of rows, written with plain
    file writes: a memory-mapped output's dirty pages would count in the process's resident memory, which at
    millions of rows reads as gigabytes. ValueError when the blocks do not hold `shape[0]` rows."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)), "fortran_order": False, "shape": shape}
    written = 0
    with open(path, "wb") as out:
        np.lib.format.write_array_header_1_0(out, header)
        for block in blocks:
            out.write(np.ascontiguousarray(block, dtype=np.float16).tobytes())
            written += len(block)
    if written != shape[0]:
        path.unlink(missing_ok=True)
        raise ValueError(f"{path}: {written} rows written where {shape[0]} were due")
    return path


def check_vectors(vectors: str | os.PathLike, *, count: int, dim: int) -> list[tuple[Path, np.ndarray]]:
    """The shards of `vectors` when they hold `count` rows of dimension `dim`; ValueError with both numbers
    where they do not (no row is read for that)."""
    shards = vector_shards(vectors)
    total, have = sum(len(a) for _, a in shards), shards[0][1].shape[1]
    if total != count:
        raise ValueError(f"{vectors}: {total:,} vectors for a corpus of {count:,} passages (they must match, in order)")
    if have != dim:
        raise ValueError(f"{vectors}: vectors of dimension {have}, the encoder's is {dim}")
    return shards


def copy_checked(
    vectors: str | os.PathLike,
    out: Path,
    *,
    count: int,
    dim: int,
    progress: bool = True,
    on_block: Callable[[int], None] | None = None,
) -> Path:
    """Copy `vectors` into `out` as one (count, dim) float16 `.npy`, block by block (memory bounded at any N),
    refusing the first row that is not finite (NaN or infinite) with its file and row. A float16 source is
    copied as it is; a float32 one is rounded to float16 (what the index stores)."""
    shards = check_vectors(vectors, count=count, dim=dim)
    bar = tqdm(total=count, unit="vector", desc="checking vectors", disable=not progress, dynamic_ncols=True)

    def checked_blocks() -> Iterator[np.ndarray]:
        for path, offset, start, block in _blocks(shards):
            finite = np.isfinite(block).all(axis=1)
            if block.dtype == np.float32:
                block = block.astype(np.float16)
                finite &= np.isfinite(block).all(axis=1)  # beyond float16's range: infinite once stored
            if not finite.all():
                bad = int(np.flatnonzero(~finite)[0])
                raise ValueError(
                    f"{path}: row {start + bad} (passage {offset + start + bad} of the corpus) is not finite "
                    "(NaN or infinite, or beyond float16's range); no index was built"
                )
            yield block
            bar.update(len(block))  # (once the block is written)
            if on_block is not None:
                on_block(offset + start + len(block))

    try:
        write_float16_rows(out, (count, dim), checked_blocks())
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    bar.close()
    return out
