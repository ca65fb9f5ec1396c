"""What the index benchmarks share: their default data, peak-RSS probes and target checks.

Default data: the chunked nq824 + WikiText-2 corpus and its all-MiniLM-L6-v2 `Flat` index at
`runs/bench-nq824/{corpus,index}` — the ones `bench/nq824.py` makes (same inputs, order and
settings) — built here when absent: the corpus in seconds, the index in about 4 minutes on
2 cores (7,278 passages at ~33 passages/s).

Peak RSS: `reset_peak_rss()` sets the kernel's high-water mark (VmHWM) to the current RSS
(`/proc/self/clear_refs`, "5"); `peak_rss_bytes()` reads it back. Unlike `ru_maxrss`, it is
not inherited from a parent process, so a child measures only itself.
"""

from __future__ import annotations

import operator
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
NQ824_RUN = ROOT / "runs" / "bench-nq824"
NQ824_DOCUMENTS = [SHARED / "wikitext2-articles.jsonl", SHARED / "nq824" / "documents.jsonl"]
NQ824_QUESTIONS = SHARED / "nq824" / "dev.jsonl"
# the larger real set of issue 16: nq824 + WikiText-2 + every SQuAD paragraph (train and dev)
SQUAD = SHARED / "squad"
LARGE_RUN = ROOT / "runs" / "bench-large"
LARGE_QUESTIONS = [SHARED / "nq-open" / "NQ-open.dev.jsonl", SQUAD / "dev-v1.1.json"]


def ensure_nq824_corpus(path: Path = NQ824_RUN / "corpus") -> Path:
    """The prepared nq824 + WikiText-2 corpus (100-word passages) at `path`, made if absent."""
    if not (path / "corpus.json").is_file():
        sys.path.insert(0, str(ROOT))
        from retriever.corpus import prepare_corpus

        missing = [str(p) for p in NQ824_DOCUMENTS if not p.is_file()]
        if missing:
            raise SystemExit(f"cannot build the default corpus: {', '.join(missing)} not found")
        print(f"preparing the nq824 + WikiText-2 corpus at {path}", file=sys.stderr, flush=True)
        prepare_corpus(NQ824_DOCUMENTS, path, chunk_words=100, progress=False)
    return path


def ensure_nq824_index(path: Path = NQ824_RUN / "index", corpus: Path | None = None) -> Path:
    """The MiniLM `Flat` index of the nq824 corpus at `path`, built if absent (resumable)."""
    if not (path / "manifest.json").is_file():
        sys.path.insert(0, str(ROOT))
        from atlas.config import RetrieverConfig
        from retriever.index.build import build_index
        from retriever.retriever import Retriever

        corpus = ensure_nq824_corpus(corpus) if corpus is not None else ensure_nq824_corpus()
        print(f"building the MiniLM Flat index at {path} (~4 min on 2 cores)", file=sys.stderr, flush=True)
        build_index(
            corpus, Retriever.from_config(RetrieverConfig(model="minilm")), path, progress=True, encoder_source="minilm"
        )
    return path


def squad_documents(out: Path) -> Path:
    """Every distinct SQuAD v1.1 paragraph (train, then dev) as JSONL documents {id, title, text}
    at `out` (written once), so that `prepare_corpus` chunks them like any other documents."""
    if out.is_file():
        return out
    import json

    seen: set[str] = set()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w") as f:
        for split in ("train-v1.1.json", "dev-v1.1.json"):
            for article in json.loads((SQUAD / split).read_text())["data"]:
                for i, paragraph in enumerate(article["paragraphs"]):
                    if paragraph["context"] in seen:
                        continue
                    seen.add(paragraph["context"])
                    record = {
                        "id": f"squad-{split[:3]}-{article['title']}-{i}",
                        "title": article["title"].replace("_", " "),
                        "text": paragraph["context"],
                    }
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.rename(out)
    return out


def ensure_large_index(path: Path = LARGE_RUN / "index") -> Path | None:
    """The MiniLM `Flat` index of nq824 + WikiText-2 + all SQuAD paragraphs (100-word passages,
    ≈ 30k+) at `path`, built if absent (resumable: an interrupted build continues), or None when
    the shared data is not there. Embedding takes ~20-40 min on 2 busy cores, once."""
    if (path / "manifest.json").is_file():
        return path
    missing = [str(p) for p in [*NQ824_DOCUMENTS, SQUAD / "train-v1.1.json", *LARGE_QUESTIONS] if not p.is_file()]
    if missing:
        print(f"skipping the large real set: {', '.join(missing)} not found", file=sys.stderr)
        return None
    sys.path.insert(0, str(ROOT))
    from atlas.config import RetrieverConfig
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.index.settings import IndexSettings
    from retriever.retriever import Retriever

    corpus = LARGE_RUN / "corpus"
    if not (corpus / "corpus.json").is_file():
        documents = [*NQ824_DOCUMENTS, squad_documents(LARGE_RUN / "squad-paragraphs.jsonl")]
        prepare_corpus(documents, corpus, chunk_words=100, progress=False)
    print(f"building the MiniLM Flat index at {path} (once; resumable)", file=sys.stderr, flush=True)
    build_index(
        corpus,
        Retriever.from_config(RetrieverConfig(model="minilm")),
        path,
        IndexSettings(chunk_size=2048),
        progress=True,
        encoder_source="minilm",
    )
    return path


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> int:
    """Reset this process's RSS high-water mark to its current RSS; return that RSS (bytes)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    """This process's RSS high-water mark (VmHWM) since start or the last `reset_peak_rss`."""
    return _status_bytes("VmHWM")


def current_rss_bytes() -> int:
    """This process's resident set size now (VmRSS)."""
    return _status_bytes("VmRSS")


_OPS = {">=": operator.ge, "<=": operator.le, "<": operator.lt, ">": operator.gt}


def target(name: str, value: float | None, op: str, threshold: float, note: str = "") -> dict:
    """One issue target: `value op threshold`, and whether it is met (None when not measured)."""
    met = None if value is None else bool(_OPS[op](value, threshold))
    return {"target": name, "value": value, "op": op, "threshold": threshold, "met": met, "note": note}


def print_targets(targets: list[dict]) -> None:
    """A line per target: name, measured value, threshold, MET / NOT MET."""
    print("\nissue targets:")
    for t in targets:
        value = "n/a" if t["value"] is None else f"{t['value']:.3g}"
        verdict = {True: "MET", False: "NOT MET", None: "not measured"}[t["met"]]
        note = f"  ({t['note']})" if t["note"] else ""
        print(f"  {t['target']}: {value} {t['op']} {t['threshold']:g} → {verdict}{note}")
