"""Index types: the registry of FAISS `index_factory` specs every vector store in atlas uses (the passage
index, the kNN-LM datastore); brute-force search is `retriever.index.exact_search`.

* `build_faiss_index(spec, dim, metric)` turns a spec from the registry `INDEX_TYPES`
  (`Flat`, `IVF{n},Flat`, `IVF{n},PQ{m}`, `PQ{m}`, their OPQ and 4-bit fast-scan forms,
  `HNSW{M}`, `SQ8`) into an untrained `faiss.Index`; an unknown spec raises `ValueError`
  listing the valid forms.
* `faiss_read_flags(spec, dim)` gives the `faiss.read_index` flags that memory-map a saved
  index of that family (FAISS supports different flags per family, and rejects a mix);
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import faiss

Metric = Literal["ip", "l2"]
FAISS_METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}


@dataclass(frozen=True)
class IndexType:
    """One family of index specs: the spec's pattern and what it costs.

    `needs_training` says whether `index.train(sample)` must run before `add`;
    `search_param` names the knob set at search time (`nprobe`, `efSearch`) or is None.
    `mmap` says how FAISS memory-maps a saved index of the family: "inverted_lists" (IVF:
    `IO_FLAG_MMAP` turns the lists into a read-only `OnDiskInvertedLists` over the file) or
    "codes" (flat-code indexes and HNSW: `IO_FLAG_MMAP_IFC` maps the code array / storage) or
    "none" (fast-scan: FAISS reads its blocked codes into memory whatever the flags).
    `shard` says how a sharded index (retriever/index/sharded.py) splits it over ranks: "rows"
    (each rank keeps a contiguous range of positions; exact) or "replicate" (HNSW: a graph
    restricted to some ids is searched differently, so each rank searches the whole of it).
    `appends` says how an edit adds rows (retriever/index/update.py): "part" (a FAISS file of the
    new rows alone, filled from the trained, empty index kept at build; searched beside the others
    and merged into one at compaction with FAISS's `merge_from`) or "rewrite" (HNSW: a graph is
    one whole, and FAISS cannot merge two: the index is written again with the new rows).
    """

    pattern: str
    example: str
    needs_training: bool
    search_param: str | None
    mmap: Literal["inverted_lists", "codes", "none"] = "codes"
    shard: Literal["rows", "replicate"] = "rows"
    appends: Literal["part", "rewrite"] = "part"


def _check_numbers(match: re.Match, dim: int) -> None:
    """The numbers of a spec: n and M positive; PQ{m} with m > 0 dividing the dimension; OPQ{o} with o = m
    (it rotates the vectors for PQ{m}: FAISS needs one rotation block per code byte)."""
    numbers = {group: int(value) for group, value in match.groupdict().items()}
    for group in ("n", "M"):
        if numbers.get(group, 1) <= 0:
            raise ValueError(f"index spec {match.string!r}: {group} must be positive")
    m = numbers.get("m")
    if m is not None and (m <= 0 or dim % m != 0):
        raise ValueError(f"index spec {match.string!r}: PQ{m} needs m > 0 dividing the dimension {dim}")
    if "o" in numbers and numbers["o"] != m:
        raise ValueError(
            f"index spec {match.string!r}: OPQ{match.group('o')} must match PQ{match.group('m')} (e.g. OPQ64,PQ64)"
        )


# The registry of index families. Keys are family names; values say how a spec is recognised.
INDEX_TYPES: dict[str, IndexType] = {
    "flat": IndexType(r"Flat", "Flat", False, None),
    "ivf_flat": IndexType(r"IVF(?P<n>\d+),Flat", "IVF1024,Flat", True, "nprobe", mmap="inverted_lists"),
    "ivf_pq": IndexType(r"IVF(?P<n>\d+),PQ(?P<m>\d+)", "IVF1024,PQ64", True, "nprobe", mmap="inverted_lists"),
    "pq": IndexType(r"PQ(?P<m>\d+)", "PQ64", True, None),
    # OPQ: a learned rotation before PQ (lower quantisation error on real embeddings). The
    # flat-code form is not split by rows (its codes sit behind the rotation); each rank
    # searches all of it. The IVF form splits like IVF-PQ.
    "opq_pq": IndexType(r"OPQ(?P<o>\d+),PQ(?P<m>\d+)", "OPQ64,PQ64", True, None, shard="replicate"),
    "opq_ivf_pq": IndexType(
        r"OPQ(?P<o>\d+),IVF(?P<n>\d+),PQ(?P<m>\d+)", "OPQ64,IVF1024,PQ64", True, "nprobe", mmap="inverted_lists"
    ),
    # 4-bit PQ codes scanned with SIMD look-up tables held in registers ("fast scan"): m/2 bytes
    # a vector and several times the speed of 8-bit PQ, at a coarser approximation that an
    # exact re-rank (`exact_rerank`) corrects. FAISS packs the codes in blocks of 32 vectors, so a
    # rank cannot take its rows out of the file: sharded ranks each search the whole index.
    # The codes are read into RAM (that is what a compressed index is for).
    "pq_fastscan": IndexType(r"PQ(?P<m>\d+)x4fs", "PQ96x4fs", True, None, mmap="none", shard="replicate"),
    "ivf_pq_fastscan": IndexType(
        r"IVF(?P<n>\d+),PQ(?P<m>\d+)x4fs", "IVF1024,PQ96x4fs", True, "nprobe", mmap="none", shard="replicate"
    ),
    "hnsw": IndexType(r"HNSW(?P<M>\d+)", "HNSW32", False, "efSearch", shard="replicate", appends="rewrite"),
    "sq8": IndexType(r"SQ8", "SQ8", True, None),
}


def parse_spec(spec: str, dim: int) -> tuple[str, re.Match]:
    """Return `(family, match)` for an index spec, or raise `ValueError` listing valid forms."""
    spec = spec.strip()
    for family, index_type in INDEX_TYPES.items():
        match = re.fullmatch(index_type.pattern, spec)
        if match:
            _check_numbers(match, dim)
            return family, match
    valid = ", ".join(t.example for t in INDEX_TYPES.values())
    raise ValueError(f"unknown index spec {spec!r}; valid forms (n, m, M integers): {valid}")


def index_type(spec: str, dim: int) -> IndexType:
    """The registry entry that `spec` belongs to (validated against `dim`)."""
    return INDEX_TYPES[parse_spec(spec, dim)[0]]


def faiss_read_flags(spec: str, dim: int, *, mmap: bool = True) -> int:
    """The `faiss.read_index` flags for a saved index of `spec`: memory-mapped and read-only
    when `mmap`, else 0 (read into memory, writable).

    FAISS 1.15 maps IVF inverted lists with `IO_FLAG_MMAP` and flat codes / HNSW storage with
    `IO_FLAG_MMAP_IFC`; it rejects both at once on an IVF file, so the family decides.
    """
    kind = index_type(spec, dim).mmap
    if not mmap or kind == "none":
        return 0
    flag = faiss.IO_FLAG_MMAP if kind == "inverted_lists" else faiss.IO_FLAG_MMAP_IFC
    return flag | faiss.IO_FLAG_READ_ONLY


def check_metric(metric: str) -> None:
    """Raise `ValueError` naming the valid metrics when `metric` is not one of them."""
    if metric not in FAISS_METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(FAISS_METRICS)}")


def build_faiss_index(spec: str, dim: int, metric: Metric = "ip") -> faiss.Index:
    """An empty (untrained) FAISS index of the given spec over `dim`-dimensional vectors.

    `metric="ip"` ranks by inner product (higher first), `"l2"` by squared distance (lower
    first). PQ codes use 8 bits per sub-quantizer, so `PQ{m}` stores m bytes per vector;
    `PQ{m}x4fs` 4 bits (m/2 bytes, fast-scan).
    """
    check_metric(metric)
    parse_spec(spec, dim)
    index = faiss.index_factory(dim, spec.strip(), FAISS_METRICS[metric])
    # The factory turns on polysemous training for PQ codes: a simulated-annealing pass that
    # only serves Hamming-filtered search (unused here) and would dominate training time.
    # (downcast: `try_extract_index_ivf` returns the IndexIVF base class, which has no such flag)
    inner = faiss.downcast_index(faiss.try_extract_index_ivf(index) or search_parameters_target(index))
    if hasattr(inner, "do_polysemous_training"):
        inner.do_polysemous_training = False
    return index


def search_parameters_target(index: faiss.Index) -> faiss.Index:
    """The index that search parameters reach: the inner index of an `IndexPreTransform`
    (OPQ: FAISS passes the parameters through the rotation), else the index itself; downcast."""
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        return faiss.downcast_index(index.index)
    return index


def set_search_params(index: faiss.Index, *, nprobe: int | None = None, ef_search: int | None = None) -> None:
    """Set the search-time knob of an IVF (`nprobe`) or HNSW (`efSearch`) index in place.

    Other index types have no such knob and are left unchanged.
    """
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and nprobe is not None:
        ivf.nprobe = int(nprobe)
    hnsw = getattr(faiss.downcast_index(index), "hnsw", None)
    if hnsw is not None and ef_search is not None:
        hnsw.efSearch = int(ef_search)
