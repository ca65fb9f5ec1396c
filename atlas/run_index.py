"""The index of a run: made when a recipe names a corpus (`prepare_index`, the verb that builds or links one:
never called by a load), opened with a recipe's search settings (`open_index`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from atlas.assembly import run_retriever
from atlas.config import AtlasConfig, IndexConfig
from atlas.distributed import agree_on_rank0, current_context
from atlas.index_api import compute_device
from retriever.corpus import Corpus
from retriever.index import PassageIndex
from retriever.index.build import build_index, build_settings, cached_index, link_index, publish_to_cache
from retriever.index.manifest import Manifest
from retriever.index.sharded import ShardedPassageIndex
from retriever.retriever import Retriever

logger = logging.getLogger(__name__)


def prepare_index(
    config: AtlasConfig,
    *,
    retriever: Retriever | None = None,
    checkpoint: str | Path | None = None,
    progress: bool = True,
) -> Path | None:
    """The folder of the run's passage index, made when it has to be: `index.path`, else an index of
    `index.corpus` at OUT/index; None when the run has neither (closed book, given passages).

    `index.path` wins: when it is set, the index there is used as it is and nothing is built
    from `index.corpus` (the index's manifest names its own corpus; a warning says when the two
    differ).
    Otherwise OUT/index (OUT = `training.output_dir`) is used when it exists (a resumed run);
    else it is linked from the cache beside the corpus (`CORPUS/.atlas-index-cache/KEY/`, see
    retriever/index/build.py) when an index of the same corpus was built there with the same
    passage encoder and index settings (fingerprints in KEY), else built, with the passage encoder of
    `retriever`, else of `checkpoint` (its `retriever/`), else the one `retriever.model` names, and then
    published to that cache. The run's copy shares the cache's files (hard links) and is its own: updating
    it never changes the cache.

    Under torchrun the ranks build it together (retriever/index/build.py: rank r embeds
    chunks r, r + N, …; rank 0 trains the FAISS index and writes the folder; barriers keep
    them in step), so no two ranks write the same files; rank 0 alone reads and writes the
    cache, and every rank follows its decision. `training.output_dir` must be on a file
    system every rank sees. The passage encoder runs on this rank's GPU when there is one.
    """
    if config.task.closed_book:
        return None
    path = config.index.path
    context = current_context()
    rank, world_size, barrier = context.rank, context.world_size, context.barrier
    if path is not None and config.index.corpus and rank == 0:
        _warn_if_other_corpus(path, config.index.corpus)
    if path is None and config.index.corpus:
        path = Path(config.training.output_dir) / "index"
        if agree_on_rank0(not path.exists()):
            retriever = retriever or run_retriever(config, checkpoint)
            _make_run_index(
                config, retriever, path, rank=rank, world_size=world_size, barrier=barrier, progress=progress
            )
    return None if path is None else Path(path)


def open_index(
    path: str | Path, retriever: Retriever, index_config: IndexConfig, *, rank: int = 0, world_size: int = 1
):
    """The index at `path` with the search settings and checks of `index_config`; this rank's shard
    of it when `index.sharded` and there are several ranks (a `retriever.index.PassageIndex`). Used by a load
    and after a refresh."""

    index = PassageIndex.load(
        path,
        retriever=retriever,
        allow_encoder_mismatch=index_config.allow_encoder_mismatch,
        nprobe=index_config.nprobe,
        ef_search=index_config.ef_search,
        exact_rerank=index_config.exact_rerank,
    )
    if index_config.sharded and world_size > 1:
        index = ShardedPassageIndex.from_index(index, rank, world_size)
    return index


def _warn_if_other_corpus(index_path: str, corpus_path: str) -> None:
    """Both `index.path` and `index.corpus` set: say so when the index was built on another corpus."""
    # heavy: pyarrow and faiss (corpus and index files), only for a run with an index

    built_on = Manifest.load(index_path).segments[0].fingerprint
    if Corpus.load(corpus_path).fingerprint != built_on:
        logger.warning(
            "index.path %s was built on another corpus than index.corpus %s; index.path is used "
            "(it wins over index.corpus)",
            index_path,
            corpus_path,
        )


def _make_run_index(
    config: AtlasConfig,
    retriever: Retriever,
    path: Path,
    *,
    rank: int,
    world_size: int,
    barrier: Callable[[], None],
    progress: bool = True,
) -> None:
    """Write the run's index of `index.corpus` at `path`: linked from the cache, or built and cached (a progress bar
    on rank 0 where `progress`)."""
    # heavy: pyarrow and faiss (corpus and index build), only for a run with an index

    corpus, index_settings = config.index.corpus, config.index_settings()
    settings = cached = None  # the cache key: what fixes the index's files
    if rank == 0:  # rank 0 alone reads and writes the cache; the others follow its decision
        settings = build_settings(Corpus.load(corpus), retriever, index_settings)
        cached = cached_index(corpus, settings)
    encoder = f"{config.retriever.model} (passage encoder {settings['encoder_fingerprint'][:12]})" if settings else ""
    if agree_on_rank0(cached is not None):
        if rank == 0:
            logger.info("reusing the index of %s built with %s at %s", corpus, encoder, cached)
            link_index(cached, path, corpus_path=corpus, nprobe=config.index.nprobe, ef_search=config.index.ef_search)
        barrier()  # the run's copy is complete
        return
    if rank == 0:
        logger.info("building the index of %s with %s at %s on %d rank(s)", corpus, encoder, path, world_size)
    retriever.to(compute_device())
    build_index(
        corpus,
        retriever,
        path,
        index_settings,
        progress=progress and rank == 0,
        rank=rank,
        world_size=world_size,
        barrier=barrier,
    )
    if rank == 0:  # before anything can update the run's copy
        published = publish_to_cache(path, corpus, settings)
        if published is not None:
            logger.info("cached the index of %s at %s for later runs", corpus, published)
        else:
            logger.info(
                "the index of %s is not cached: its folder is read-only or on another file system than %s", corpus, path
            )
