"""How an index is built, and how it is searched unless told otherwise: the one place these defaults are written.

`build_index` takes an `IndexSettings`; the recipe's `index` section (`atlas.config.IndexConfig`), the command
line (`atlas index build|embed|add|update`, `atlas import atlas-index`) and `atlas.Index.build` take their defaults
from it. Light (no faiss, no torch), so that configuration and argument parsing can read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from common.config_section import config_section


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
    # None, not 0, so that one default serves both uses: a search keeps the index's own k', a build re-ranks none
    exact_rerank: int | None = field(
        default=None,
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
        k = self.exact_rerank
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
            raise ValueError(f"exact_rerank must be an integer k' >= 0 (0 = off), got {k!r}")

    @property
    def keeps_vectors(self) -> bool:
        """Whether the float16 vectors stay beside the index (asked for, or needed by the exact re-rank)."""
        return self.keep_embeddings or self.rerank_width > 0

    @property
    def rerank_width(self) -> int:
        """The k' a build records as the index's own (0 = off)."""
        return self.exact_rerank or 0

    @classmethod
    def of(cls, source, **given) -> IndexSettings:
        """The settings named like fields of any object that has them (an `argparse.Namespace`, a config
        section), then `given`; a field neither has, or has as None ("the index's own"), keeps its default."""
        values = {f.name: getattr(source, f.name, None) for f in dataclasses.fields(cls)} | given
        return cls(**{name: value for name, value in values.items() if value is not None})


DEFAULTS = IndexSettings()


@config_section
class IndexConfig:
    """The passage corpus and the FAISS-style index over it (build settings: `retriever.index.settings`)."""

    # Which index a run searches. `path` wins: when it is set, that index (a folder made by
    # `atlas index build`) is opened as it is and nothing is built from `corpus` (the index's
    # manifest names its own corpus; a warning says when the two differ). With `path` unset, the
    # run uses an index of `corpus` (a folder made by `atlas corpus prepare`) at
    # training.output_dir/index: kept from an earlier start of the run, else linked from
    # CORPUS/.atlas-index-cache/ when an index of the same corpus, passage encoder and index
    # settings (spec, keep_embeddings, exact_rerank, train_sample, chunk_size, retriever.batch_size) was
    # built before, else built and cached there (atlas.run_index.prepare_index; docs/guides/corpus.md).
    corpus: str | None = None
    # A built index folder (`atlas index build`) to open as it is; wins over `corpus`.
    path: str | None = None
    spec: str = DEFAULTS.spec
    nprobe: int = DEFAULTS.nprobe
    ef_search: int = DEFAULTS.ef_search
    train_sample: int = DEFAULTS.train_sample
    keep_embeddings: bool = DEFAULTS.keep_embeddings
    refresh: str = "never"  # e.g. "0-1000:500,1000-10000:2000"
    # Training with a stale index: search this many candidates and re-score them with passage vectors
    # re-encoded by the current passage encoder (0 = off; used when > the k retrieved).
    reencode_candidates: int = 0
    # Two-stage search of a compressed index: its top k' candidates re-scored exactly from the
    # float16 vectors kept memory-mapped on disk. None: the index's own setting (its manifest,
    # `exact_rerank`); 0: off. Building with k' > 0 keeps the vectors. Not `reencode_candidates`
    # (that re-encodes candidates with the current, training encoder).
    exact_rerank: int | None = DEFAULTS.exact_rerank
    # Pretext tasks drop a retrieved passage whose id is the example's own source: retrieve this many times k so that k
    # remain.
    filtering_overretrieve_ratio: int = 2
    # Search even when the query encoder's fingerprint differs from the passage encoder the index was built with (for
    # experts; the results are usually meaningless).
    allow_encoder_mismatch: bool = False
    chunk_size: int = DEFAULTS.chunk_size
    # Under torchrun: each rank searches 1/N of the index (True) or the whole of it (False).
    sharded: bool = False
