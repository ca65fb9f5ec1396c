"""How an index is built, and how it is searched unless told otherwise: the one place these defaults are written.

`build_index` takes an `IndexSettings`; the recipe's `index` section (`atlas.config.IndexConfig`), the command
line (`atlas index build|embed|add|update`, `atlas import atlas-index`) and `atlas.Index.build` take their defaults
from it. Light (no faiss, no torch), so that configuration and argument parsing can read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class IndexSettings:
    """The settings of one index build. The search settings (`nprobe`, `ef_search`, `exact_rerank`) are recorded
    in the manifest as the index's own, which a search may override at load."""

    spec: str = field(
        default="Flat",
        metadata={
            "help": "the index type: Flat (the float16 vectors, searched exactly), IVF{n},Flat, IVF{n},PQ{m}, "
            "PQ{m}, OPQ{m},PQ{m}, OPQ{m},IVF{n},PQ{m}, HNSW{M}, SQ8"
        },
    )
    batch_size: int = field(default=64, metadata={"help": "passages per encoder batch"})
    chunk_size: int = field(default=8192, metadata={"help": "passages embedded per resumable chunk"})
    train_sample: int = field(default=262144, metadata={"help": "vectors sampled to train a FAISS index"})
    keep_embeddings: bool = field(
        default=False, metadata={"help": "keep the float16 vectors beside a compressed index (implied by exact_rerank)"}
    )
    exact_rerank: int = field(
        default=0,
        metadata={
            "help": "a compressed index's top k' candidates re-scored exactly from its float16 vectors (kept, "
            "memory-mapped; e.g. 10x k); recorded as the index's own; 0 = off"
        },
    )
    nprobe: int = field(default=32, metadata={"help": "IVF lists probed at search time (recorded as the index's own)"})
    ef_search: int = field(default=128, metadata={"help": "HNSW search breadth (recorded as the index's own)"})
    seed: int = field(default=0, metadata={"help": "seed of the sample a FAISS index is trained on"})

    def __post_init__(self) -> None:
        for name in ("batch_size", "chunk_size", "train_sample", "nprobe", "ef_search"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"index setting {name} must be a positive integer, got {value!r}")
        if not isinstance(self.exact_rerank, int) or isinstance(self.exact_rerank, bool) or self.exact_rerank < 0:
            raise ValueError(f"exact_rerank must be an integer k' >= 0 (0 = off), got {self.exact_rerank!r}")

    @property
    def keeps_vectors(self) -> bool:
        """Whether the float16 vectors stay beside the index (asked for, or needed by the exact re-rank)."""
        return self.keep_embeddings or self.exact_rerank > 0

    @classmethod
    def of(cls, source, **given) -> IndexSettings:
        """The settings named like fields of any object that has them (an `argparse.Namespace`, a config
        section), then `given`; a field neither has, or has as None ("the index's own"), keeps its default."""
        values = {f.name: getattr(source, f.name, None) for f in dataclasses.fields(cls)} | given
        return cls(**{name: value for name, value in values.items() if value is not None})


DEFAULTS = IndexSettings()
