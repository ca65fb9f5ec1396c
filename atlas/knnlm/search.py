"""kNN-LM search and interpolation: neighbours, p_kNN with a temperature τ, λ/τ tuning.

    p(y | x) = λ · p_kNN(y | x) + (1 − λ) · p_LM(y | x)
    p_kNN(y | x) ∝ Σ_{neighbours i with value y} exp(−d_i / τ)

d is the squared L2 distance (metric "l2") or the negated inner product (metric "ip").
Search uses the shared index machinery (`retriever.index.types`): exact brute force, or a
FAISS index (e.g. IVF-PQ) whose approximate distances can be recomputed exactly from the
stored keys.
"""

from __future__ import annotations

import math
from pathlib import Path

import faiss
import numpy as np
import torch

from atlas.knnlm.datastore import Datastore, check_same_producer, key_file_name
from retriever.index.exact_search import exact_search
from retriever.index.types import build_faiss_index, set_search_params


def knn_target_logprobs(
    distances: np.ndarray, neighbour_values: np.ndarray, targets: np.ndarray, temperature: float
) -> np.ndarray:
    """log p_kNN(target): distances (Q, k), neighbour values (Q, k), targets (Q,) → (Q,) float64.

    −inf where no neighbour carries the target.
    """
    scaled = torch.from_numpy(np.asarray(distances, dtype=np.float64)) / -temperature  # (Q, k)
    normaliser = torch.logsumexp(scaled, dim=1)
    hits = torch.from_numpy(np.asarray(neighbour_values) == np.asarray(targets)[:, None])
    on_target = torch.logsumexp(scaled.masked_fill(~hits, -math.inf), dim=1)
    return (on_target - normaliser).numpy()


def interpolate_logprobs(lm_logprobs: np.ndarray, knn_logprobs: np.ndarray, lam: float) -> np.ndarray:
    """log(λ·p_kNN + (1−λ)·p_LM) per token, computed in log space (Q,) → (Q,)."""
    lm = np.asarray(lm_logprobs, dtype=np.float64)
    if lam == 0.0:
        return lm
    knn = np.asarray(knn_logprobs, dtype=np.float64)
    if lam == 1.0:
        return knn
    with np.errstate(divide="ignore"):
        return np.logaddexp(math.log(lam) + knn, math.log1p(-lam) + lm)


def perplexity(logprobs: np.ndarray) -> float:
    """exp(−mean log-prob) over tokens."""
    return float(np.exp(-np.mean(np.asarray(logprobs, dtype=np.float64))))


def exact_distances(
    queries: np.ndarray, keys: np.ndarray, ids: np.ndarray, metric: str, chunk: int = 128
) -> np.ndarray:
    """Distances from stored keys: queries (Q, d), keys (N, d), ids (Q, k) → (Q, k) float64.

    l2: ‖q − k‖² (= ‖q‖² − 2 q·k + ‖k‖², summed as squared differences to avoid cancellation);
    ip: −q·k (so that smaller is nearer in both). `chunk` queries at a time bound the gathered keys.
    """
    out = np.empty(ids.shape, dtype=np.float64)
    for start in range(0, len(ids), chunk):
        part = np.asarray(ids[start : start + chunk])
        flat = part.reshape(-1)
        order = np.argsort(flat, kind="stable")  # memmaps read faster in increasing row order
        gathered = np.empty((len(flat), keys.shape[1]), dtype=np.float32)
        gathered[order] = keys[flat[order]]
        k = torch.from_numpy(gathered).view(*part.shape, -1)  # (C, k, d)
        q = torch.from_numpy(np.asarray(queries[start : start + chunk], dtype=np.float32)).unsqueeze(1)  # (C, 1, d)
        if metric == "ip":
            out[start : start + chunk] = -(k * q).sum(-1).double().numpy()
        else:
            out[start : start + chunk] = (k - q).pow(2).sum(-1).double().numpy()
    return out


def build_knn_index(
    datastore: Datastore,
    key_name: str,
    spec: str,
    *,
    metric: str = "l2",
    train_rows: int = 100_000,
    add_chunk: int = 65_536,
    seed: int = 0,
) -> faiss.Index:
    """Train and fill a FAISS index of `spec` (e.g. 'IVF1024,PQ32') over one key; cached on disk."""
    cache = datastore.path / (key_file_name(key_name)[:-4] + f".{spec.replace(',', '_')}.{metric}.faiss")
    if cache.exists():
        return faiss.read_index(str(cache))
    keys = datastore.keys(key_name)
    index = build_faiss_index(spec, keys.shape[1], metric)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(len(keys), size=min(train_rows, len(keys)), replace=False))
    index.train(np.ascontiguousarray(keys[sample], dtype=np.float32))
    for start in range(0, len(keys), add_chunk):
        index.add(np.ascontiguousarray(keys[start : start + add_chunk], dtype=np.float32))
    tmp = cache.with_suffix(".tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(cache)
    return index


def search_neighbours(
    queries: np.ndarray,
    datastore: Datastore,
    key_name: str,
    k: int,
    *,
    metric: str = "l2",
    index: faiss.Index | None = None,
    nprobe: int = 32,
    recompute: bool = False,
    chunk_rows: int = 65_536,
) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours of queries (Q, d): (distances (Q, k) float64, datastore row ids (Q, k)).

    index None → exact search; otherwise the FAISS index, with its approximate distances,
    or distances recomputed exactly from the stored keys when `recompute`.
    """
    keys = datastore.keys(key_name)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if index is None:
        scores, ids = exact_search(queries, keys, k, metric, chunk_rows=chunk_rows)
    else:
        set_search_params(index, nprobe=nprobe)
        scores, ids = index.search(queries, k)
    missing = ids < 0
    ids = np.where(missing, 0, ids)  # IVF may return fewer than k: give them zero weight below
    if recompute and index is not None:
        distances = exact_distances(queries, keys, ids, metric)
    else:
        distances = scores.astype(np.float64) if metric == "l2" else -scores.astype(np.float64)
    distances[missing] = np.inf
    return distances, ids


def knn_lm_logprobs(
    query_store: Datastore,
    datastore: Datastore,
    key_name: str,
    *,
    k: int,
    settings: list[tuple[float, float]],
    metric: str = "l2",
    index: faiss.Index | None = None,
    nprobe: int = 32,
    recompute: bool = False,
    query_chunk: int = 2048,
    limit: int | None = None,
) -> dict[tuple[float, float], np.ndarray]:
    """Per-token kNN-LM log-probs of a query store for each (λ, τ) in `settings`, in chunks.

    The query store holds the test text's keys, targets (values) and LM log-probs; it must
    come from the datastore's model and tokenizer (`check_same_producer`, ValueError
    otherwise). Returns {(λ, τ): (Q,) float64}.
    """
    check_same_producer(query_store, datastore)
    n = len(query_store) if limit is None else min(limit, len(query_store))
    queries, targets, lm = query_store.keys(key_name), query_store.values, query_store.lm_logprobs
    values = datastore.values
    out = {setting: np.empty(n) for setting in settings}
    for start in range(0, n, query_chunk):
        stop = min(n, start + query_chunk)
        distances, ids = search_neighbours(
            queries[start:stop],
            datastore,
            key_name,
            k,
            metric=metric,
            index=index,
            nprobe=nprobe,
            recompute=recompute,
        )
        neighbour_values = values[ids]
        for lam, tau in settings:
            knn = knn_target_logprobs(distances, neighbour_values, targets[start:stop], tau)
            out[(lam, tau)][start:stop] = interpolate_logprobs(lm[start:stop], knn, lam)
    return out


def grid_search(
    query_store: Datastore,
    datastore: Datastore,
    key_name: str,
    *,
    k: int,
    lambdas: list[float],
    temperatures: list[float],
    **search_kwargs,
) -> dict:
    """Tune λ and τ by perplexity on a validation query store.

    Returns {"lambda", "temperature", "perplexity", "lm_perplexity", "grid": [[λ, τ, ppl], ...]}.
    """
    settings = [(lam, tau) for lam in lambdas for tau in temperatures]
    results = knn_lm_logprobs(query_store, datastore, key_name, k=k, settings=settings, **search_kwargs)
    grid = [[lam, tau, perplexity(lp)] for (lam, tau), lp in results.items()]
    best = min(grid, key=lambda row: row[2])
    n = len(next(iter(results.values())))
    return {
        "lambda": best[0],
        "temperature": best[1],
        "perplexity": best[2],
        "lm_perplexity": perplexity(query_store.lm_logprobs[:n]),
        "grid": grid,
    }


def save_token_logprobs(path: str | Path, logprobs: np.ndarray) -> None:
    """Per-token log-probs as a float32 .npy (written to a temp name, then renamed)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, np.asarray(logprobs, dtype=np.float32))
    tmp.replace(path)
