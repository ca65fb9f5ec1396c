"""When to re-embed the index while the passage encoder trains (REALM / Atlas refresh).

A schedule is `"never"` or comma-separated `start-end:every` ranges over optimizer steps,
e.g. `"0-1000:500,1000-10000:2000"`: refresh at steps 500 (and 1000 from the second range
start), 3000, 5000, 7000, 9000. Between refreshes, `index.reencode_candidates` re-scores
over-retrieved candidates with the current passage encoder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from atlas.distributed import DistributedContext
from atlas.index_api import Index
from atlas.run_index import open_index
from common.modeling import eval_mode
from retriever.index.build import build_index

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
            raise ValueError(
                f"index.refresh: bad range {part.strip()!r}; expected START-END:EVERY, "
                "e.g. '0-1000:500,1000-10000:2000', or 'never'"
            )
        start, end, every = map(int, match.groups())
        if end <= start or every <= 0:
            raise ValueError(f"index.refresh: range {part.strip()!r} needs START < END and EVERY > 0")
        ranges.append(RefreshRange(start, end, every))
    return ranges


def refresh_due(step: int, schedule: list[RefreshRange]) -> bool:
    """Whether the index is re-embedded after optimizer step `step` (1-based)."""
    return any(r.start < step <= r.end and (step - r.start) % r.every == 0 for r in schedule)


def refresh_index(
    model,
    corpus_path: str | Path,
    out: str | Path,
    config,
    *,
    context: DistributedContext | None = None,
):
    """Re-embed `corpus_path` with the model's current passage encoder into `out`; swap it in (→ the new
    `atlas.Index`, which searches with the model's own retriever).

    Under torchrun (`context`, an `atlas.distributed.DistributedContext`) the ranks share the
    embedding work and rank 0 writes the folder; every rank then loads it (sharded again
    when `index.sharded`). The new index has `config`'s index settings (`AtlasConfig.index_settings`) and checks.
    """
    context = context if context is not None else DistributedContext()  # one process of one
    with eval_mode(model.retriever):  # a failed build leaves the retriever in the mode it was in
        build_index(
            corpus_path,
            model.retriever,
            out,
            config.index_settings(),
            progress=False,
            overwrite=True,
            restart=True,
            rank=context.rank,
            world_size=context.world_size,
            barrier=context.barrier,
        )
    opened = open_index(out, model.retriever, config.index, rank=context.rank, world_size=context.world_size)
    model.index = Index(opened, model.retriever, allow_encoder_mismatch=config.index.allow_encoder_mismatch)
    return model.index
