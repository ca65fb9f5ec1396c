"""When to re-embed the index while the passage encoder trains (REALM / Atlas refresh).

A schedule is `"never"` or comma-separated `start-end:every` ranges over optimizer steps,
e.g. `"0-1000:500,1000-10000:2000"`: refresh at steps 500 (and 1000 from the second range
start), 3000, 5000, 7000, 9000. Between refreshes, `index.rerank_overretrieve` re-scores
over-retrieved candidates with the current passage encoder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class RefreshRange:
    """Refresh every `every` steps for `start` < step ≤ `end`, counting from `start`."""

    start: int
    end: int
    every: int


def parse_refresh_schedule(text: str) -> list[RefreshRange]:
    """Parse a schedule string; ValueError with the offending part and the expected form."""
    if text.strip().lower() in ("", "never", "none"):
        return []
    ranges = []
    for part in text.split(","):
        match = _RANGE.match(part)
        if not match:
            raise ValueError(f"index.refresh: bad range {part.strip()!r}; expected START-END:EVERY, "
                             "e.g. '0-1000:500,1000-10000:2000', or 'never'")
        start, end, every = map(int, match.groups())
        if end <= start or every <= 0:
            raise ValueError(f"index.refresh: range {part.strip()!r} needs START < END and EVERY > 0")
        ranges.append(RefreshRange(start, end, every))
    return ranges


def refresh_due(step: int, schedule: list[RefreshRange]) -> bool:
    """Whether the index is re-embedded after optimizer step `step` (1-based)."""
    return any(r.start < step <= r.end and (step - r.start) % r.every == 0 for r in schedule)


def refresh_index(model, corpus_path: str | Path, out: str | Path, index_config, *, batch_size: int = 64,
                  context=None):
    """Re-embed `corpus_path` with the model's current passage encoder into `out`; swap it in.

    Under torchrun (`context`, an `atlas.distributed.DistributedContext`) the ranks share the
    embedding work and rank 0 writes the folder; every rank then loads it (sharded again
    when `index.sharded`). The new index has the same spec, search settings and checks.
    """
    from retriever.index import PassageIndex
    from retriever.index_build import build_index

    rank, world_size = (context.rank, context.world_size) if context is not None else (0, 1)
    barrier = context.barrier if context is not None else (lambda: None)
    was_training = model.retriever.training
    model.retriever.eval()
    try:
        build_index(corpus_path, model.retriever, out, spec=index_config.spec, batch_size=batch_size,
                    chunk_size=index_config.chunk_size, train_sample=index_config.train_sample,
                    keep_embeddings=index_config.keep_embeddings, rerank=index_config.rerank or 0,
                    nprobe=index_config.nprobe, ef_search=index_config.ef_search, progress=False,
                    overwrite=True, restart=True, rank=rank, world_size=world_size, barrier=barrier)
    finally:  # a failed build leaves the retriever in the mode it was in
        model.retriever.train(was_training)
    index = PassageIndex.load(out, retriever=model.retriever, nprobe=index_config.nprobe,
                              ef_search=index_config.ef_search, rerank=index_config.rerank)
    if index_config.sharded and world_size > 1:
        from retriever.sharded import ShardedPassageIndex

        index = ShardedPassageIndex.from_index(index, rank, world_size)
    model.index = index
    return index
