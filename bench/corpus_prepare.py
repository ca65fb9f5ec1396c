"""Benchmark `prepare_corpus`: documents/s and peak RSS, against a plain json.loads loop.

Each measurement runs in a fresh child process; its peak RSS is the kernel's high-water mark
(VmHWM) reset after the imports (`/proc/self/clear_refs`), so it is the child's own (ru_maxrss
would carry the parent's over fork + exec) and counts the work, not the libraries. Workloads:
(a) the real nq824 + WikiText-2 documents, chunked to 100 words;
(b) synthetic corpora of 100k and 1M one-passage documents (written once under --workdir),
    to show that peak RSS stays bounded as N grows.
The baseline reads the same files with `json.loads` into a list of dicts (what the
reference implementation does). Issue 2 target: peak RSS stays bounded as N grows — here,
peak RSS at the largest synthetic N ≤ 1.5 × at the smallest (10× the documents by default),
where the baseline's grows with N. Prints a JSON object, then a table.

    python bench/corpus_prepare.py [--sizes 100000 1000000] [--workdir runs/bench-corpus]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from index_data import print_targets, target  # bench/index_data.py

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def _child(kind: str, out: str, inputs: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from index_data import peak_rss_bytes, reset_peak_rss  # bench/index_data.py

    from retriever.corpus import prepare_corpus  # import cost is not the work being measured

    baseline = reset_peak_rss()
    start = time.perf_counter()
    if kind == "atlas":
        stats = prepare_corpus(inputs, out, chunk_words=100, overwrite=True, progress=False)
        documents, passages = stats.documents, stats.passages
    else:
        records = []
        for path in inputs:
            with open(path, encoding="utf-8") as f:
                records.extend(json.loads(line) for line in f if line.strip())
        documents = passages = len(records)
    seconds = time.perf_counter() - start
    peak = peak_rss_bytes()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak_rss_mib": peak / 2**20,
                "growth_mib": (peak - baseline) / 2**20,
                "documents": documents,
                "passages": passages,
            }
        )
    )


def measure(kind: str, inputs: list[Path], out: Path) -> dict:
    """Run one workload in a child process; returns its seconds, peak RSS and counts."""
    cmd = [sys.executable, __file__, "--child", kind, str(out), *map(str, inputs)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def synthetic(path: Path, n: int, seed: int = 0) -> Path:
    """Write `n` documents of 40–80 words from a 5,000-word vocabulary (once; reused)."""
    if path.exists():
        return path
    rng = random.Random(seed)
    vocab = [f"w{i:04d}" for i in range(5000)]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(n):
            words = " ".join(rng.choices(vocab, k=rng.randint(40, 80)))
            f.write(json.dumps({"id": f"s{i}", "title": f"Doc {i % 997}", "text": words}) + "\n")
    tmp.replace(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "bench-corpus"))
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    workloads = []
    real = [SHARED / "nq824" / "documents.jsonl", SHARED / "wikitext2-articles.jsonl"]
    if all(p.exists() for p in real):
        workloads.append(("nq824+wikitext2", real))
    for n in args.sizes:
        workloads.append((f"synthetic-{n}", [synthetic(workdir / f"synthetic-{n}.jsonl", n)]))

    results = []
    for name, inputs in workloads:
        out = workdir / f"corpus-{name}"
        ours = measure("atlas", inputs, out)
        base = measure("json", inputs, out)
        shutil.rmtree(out, ignore_errors=True)
        results.append(
            {
                "workload": name,
                "documents": ours["documents"],
                "passages": ours["passages"],
                "atlas_docs_per_s": ours["documents"] / ours["seconds"],
                "atlas_peak_rss_mib": ours["peak_rss_mib"],
                "atlas_growth_mib": ours["growth_mib"],
                "json_loop_docs_per_s": base["documents"] / base["seconds"],
                "json_loop_peak_rss_mib": base["peak_rss_mib"],
                "json_loop_growth_mib": base["growth_mib"],
                "time_ratio_atlas_over_json": ours["seconds"] / base["seconds"],
                "rss_ratio_atlas_over_json": ours["peak_rss_mib"] / base["peak_rss_mib"],
            }
        )
    synthetic_rows = [r for r in results if r["workload"].startswith("synthetic-")]
    targets = []
    if len(synthetic_rows) >= 2:
        small, large = synthetic_rows[0], synthetic_rows[-1]
        growth = large["documents"] / small["documents"]
        targets.append(
            target(
                f"peak RSS at {large['documents']:,} docs / at {small['documents']:,} ({growth:.0f}× the documents)",
                large["atlas_peak_rss_mib"] / small["atlas_peak_rss_mib"],
                "<=",
                1.5,
                f"json loop: {large['json_loop_peak_rss_mib'] / small['json_loop_peak_rss_mib']:.1f}×",
            )
        )
    print(json.dumps({"benchmark": "corpus_prepare", "results": results, "targets": targets}, indent=2))
    print(
        f"\n{'workload':<18}{'docs':>9}{'passages':>10}{'atlas doc/s':>13}{'RSS MiB':>9}"
        f"{'json doc/s':>12}{'RSS MiB':>9}{'time×':>7}{'RSS×':>7}"
    )
    for r in results:
        print(
            f"{r['workload']:<18}{r['documents']:>9}{r['passages']:>10}{r['atlas_docs_per_s']:>13.0f}"
            f"{r['atlas_peak_rss_mib']:>9.0f}{r['json_loop_docs_per_s']:>12.0f}"
            f"{r['json_loop_peak_rss_mib']:>9.0f}{r['time_ratio_atlas_over_json']:>7.2f}"
            f"{r['rss_ratio_atlas_over_json']:>7.2f}"
        )
    print_targets(targets)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        main()
