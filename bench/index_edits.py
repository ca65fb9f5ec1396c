"""An index that takes edits against a fresh build of the same passages: does it stay as fast and small?

    python bench/index_edits.py                                   # N = 100, 1,000, 10,000 on 10,000 passages
    python bench/index_edits.py --checkpoints 20 100 --base 2000  # a quick look
    python bench/index_edits.py --work W --out W/report.json      # interrupted? the same + --resume

Resumable: with `--work`, the state of the edit loop (live passages, random state, counters,
figures of the checkpoints passed) is saved after every edit, and `--resume` carries on from it
(the index's generation must be the one saved: an edit committed but not recorded is refused).

Builds a MiniLM `Flat` index of `--base` short synthetic passages (one sentence each, so that
embedding does not dominate), then applies edits one commit each through the library
(`retriever.index.update`): 40% add a new passage, 40% update a live one, 20% remove one, each
followed by the automatic compaction (`retriever.index.compact.compact_if_due`, as `atlas index
add/update/remove` and `atlas serve` run it). At each checkpoint N the edited index and a fresh
build of its live passages (a corpus prepared anew and indexed by the same encoder) are measured
alike in fresh processes, the two alternating (`--repeats` times, median):
  load_ms         `PassageIndex.load` with the encoder check, as `atlas serve` and `atlas index search`
                  load (the check hashes the encoder's tokenizer and weights, the same for both)
  load_files_ms   `PassageIndex.load` of the index alone (no encoder): what the files cost
  search_qps      queries per second, 16 query vectors a batch, k = 10, one thread: both indexes
                  loaded in one process and searched in turns (all the queries on one, then on the
                  other, for 4 s), so that a machine shared with other work slows both alike
  rss_mb          memory the process holds for the index: resident memory after loading and
                  searching, less the same process before the load (imports, the encoder and the
                  query vectors are not the index's), each read after glibc's `malloc_trim(0)` has
                  returned the freed heap to the system. Without it the figure is mostly heap that
                  the searches freed and glibc kept for reuse (each flat search allocates a float32
                  buffer of its chunk): 60 to 105 MB, edited and fresh alike, varying more from run
                  to run than between the two (the 1.75x of an early run was that), against ~12 MB
                  the index itself holds. `rss_untrimmed_mb` is that figure, shown, not targeted
  disk_bytes      every file the index needs: its folder and the corpus segments outside it
  files           their count
and the edited index must hold exactly the fresh build's live passages. The edit loop computes the
frozen encoder's fingerprint once (atlas computes it at every load; a constant, not the index's).

Prints JSON and a table with the ratio edited / fresh per figure (target: <= 1.1 for load_ms,
search_qps, rss_mb and disk_bytes; load_files_ms is shown, see `TARGETED`) and the file count
against its bound: at most 5 index files (manifest, vectors, removed, FAISS, the trained FAISS
index) and 6 per corpus segment (its 4 corpus files, and the vectors and FAISS codes an edit
writes of its own), with at most `MAX_SEGMENTS` segments once the automatic compaction has run
(53 files, the base corpus's included; one more segment between an edit and its compaction).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = [
    "river",
    "harbour",
    "mill",
    "bridge",
    "chapel",
    "market",
    "tower",
    "abbey",
    "canal",
    "quarry",
    "forest",
    "castle",
    "garden",
    "station",
    "library",
    "orchard",
    "lighthouse",
    "museum",
    "brewery",
    "theatre",
]
PLACES = [
    "Arden",
    "Belmont",
    "Corvey",
    "Dunmore",
    "Elsworth",
    "Fenwick",
    "Garrow",
    "Hollin",
    "Ivybridge",
    "Jarrow",
    "Kestle",
    "Lanark",
]

# the figures held to 1.1x of the fresh build; `load_files_ms` is shown beside them, not held to it: a
# fresh build's load of the index files alone is one segment's opening, which each further segment adds
TARGETED = ("load_ms", "search_qps", "rss_mb", "disk_bytes")

PROBE = r"""
import ctypes, json, sys, time
from pathlib import Path
import numpy as np
import datasets, faiss, torch  # imports are not the index's cost
torch.set_num_threads(1); faiss.omp_set_num_threads(1)
from retriever.index import PassageIndex
libc = ctypes.CDLL("libc.so.6")

def rss(trim=True):
    if trim:  # freed heap that glibc keeps for reuse is not held by anything
        libc.malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

folder, queries_path, encoder = sys.argv[1], sys.argv[2], sys.argv[3]
queries = np.load(queries_path)
retriever = None
if encoder:
    from atlas.index_api import index_retriever
    retriever = index_retriever(folder, encoder, device="cpu")
    retriever.passage_fingerprint()  # warm: the first call also builds the tokenizer's JSON
before = rss()
started = time.perf_counter()
index = PassageIndex.load(folder, retriever=retriever)
load = time.perf_counter() - started
index.search_vectors(queries[:16], 10)  # warm-up
searched, started = 0, time.perf_counter()
while time.perf_counter() - started < 1.0:
    for batch in range(0, len(queries), 16):
        index.search_vectors(queries[batch : batch + 16], 10)
        searched += len(queries[batch : batch + 16])
qps = searched / (time.perf_counter() - started)
untrimmed = rss(trim=False) - before
print(json.dumps({"load_ms": 1000 * load, "qps": qps, "rss_bytes": rss() - before, "rss_untrimmed_bytes": untrimmed}))
"""

SEARCH_PROBE = r"""
import json, sys, time
import numpy as np
import faiss, torch
torch.set_num_threads(1); faiss.omp_set_num_threads(1)
from retriever.index import PassageIndex

indexes = [PassageIndex.load(folder) for folder in sys.argv[1:3]]
queries = np.load(sys.argv[3])
spent = [0.0, 0.0]
for index in indexes:
    index.search_vectors(queries[:16], 10)  # warm-up
started = time.perf_counter()
rounds = 0
while time.perf_counter() - started < 4.0:
    for n, index in enumerate(indexes):
        begun = time.perf_counter()
        for batch in range(0, len(queries), 16):
            index.search_vectors(queries[batch : batch + 16], 10)
        spent[n] += time.perf_counter() - begun
    rounds += 1
print(json.dumps({"qps": [rounds * len(queries) / s for s in spent]}))
"""


def sentence(rng: random.Random, pid: str) -> dict:
    """A one-sentence passage about a made-up place (short: embedding stays cheap)."""
    place, thing = rng.choice(PLACES), rng.choice(WORDS)
    text = (
        f"The {thing} of {place} {pid} was built in {rng.randint(1200, 1990)} and has "
        f"{rng.randint(2, 90)} {rng.choice(WORDS)}s."
    )
    return {"id": pid, "title": f"{place} {thing}", "text": text}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def footprint(folder: Path) -> tuple[int, int]:
    """(bytes, files) of everything the index at `folder` needs: its folder and the corpus
    segments it names outside it."""
    from retriever.index.manifest import Manifest

    paths = [p for p in folder.rglob("*") if p.is_file()]
    for segment in Manifest.load(folder).segments:
        corpus = (folder / segment.corpus).resolve()
        if folder.resolve() not in corpus.parents:
            paths += [p for p in corpus.rglob("*") if p.is_file() and ".atlas-index-cache" not in p.parts]
    return sum(p.stat().st_size for p in paths), len(paths)


def search_probe(edited: Path, fresh: Path, queries: Path) -> tuple[float, float]:
    """Queries per second of both indexes, searched in turns in one fresh process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", SEARCH_PROBE, str(edited), str(fresh), str(queries)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    qps = json.loads(result.stdout.strip().splitlines()[-1])["qps"]
    return qps[0], qps[1]


def probe(folder: Path, queries: Path, encoder: str) -> dict:
    """One fresh process: load (with the encoder check when `encoder`), search for a second,
    RSS held and untrimmed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(folder), str(queries), encoder],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(edited: Path, fresh: Path, queries: Path, encoder: str, repeats: int) -> dict:
    """The figures of both indexes, their probes alternating, medians of `repeats`."""
    runs: dict[str, dict[str, list[float]]] = {"edited": {}, "fresh": {}}
    for _ in range(repeats):
        for name, folder in (("edited", edited), ("fresh", fresh)):
            with_encoder = probe(folder, queries, encoder)
            alone = probe(folder, queries, "")
            for key, value in (
                ("load_ms", with_encoder["load_ms"]),
                ("load_files_ms", alone["load_ms"]),
                ("rss_mb", with_encoder["rss_bytes"] / 2**20),
                ("rss_untrimmed_mb", with_encoder["rss_untrimmed_bytes"] / 2**20),
            ):
                runs[name].setdefault(key, []).append(value)
        for name, qps in zip(("edited", "fresh"), search_probe(edited, fresh, queries)):
            runs[name].setdefault("search_qps", []).append(qps)
    out = {}
    for name, folder in (("edited", edited), ("fresh", fresh)):
        disk, files = footprint(folder)
        out[name] = {key: round(statistics.median(values), 2) for key, values in runs[name].items()}
        out[name].update(disk_bytes=disk, files=files)
    out["ratio"] = {
        key: round(out["edited"][key] / out["fresh"][key], 3) if out["fresh"][key] else None for key in out["fresh"]
    }
    out["ratio"]["search_qps"] = round(out["fresh"]["search_qps"] / out["edited"]["search_qps"], 3)  # time ratio
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=int, default=10_000, help="passages of the first build")
    parser.add_argument(
        "--checkpoints", type=int, nargs="+", default=[100, 1_000, 10_000], help="edit counts at which to measure"
    )
    parser.add_argument("--encoder", default="minilm")
    parser.add_argument("--spec", default="Flat")
    parser.add_argument("--repeats", type=int, default=5, help="probe runs per index at each checkpoint")
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    parser.add_argument("--out", help="also write the JSON report here")
    parser.add_argument("--resume", action="store_true", help="carry on from the state saved in --work")
    args = parser.parse_args(argv)
    if args.resume and not args.work:
        parser.error("--resume needs the --work folder of the interrupted run")
    return args


def refuse(message: str) -> None:
    """Stop as an argument error does: the message on stderr, exit status 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


@dataclass
class EditRun:
    """Where a run of edits stands: what is live, the report so far and the counters (saved after each edit)."""

    settings: dict
    rng: random.Random
    live: dict[str, dict]
    report: dict
    done: int = 0
    added: int = 0
    compactions: int = 0
    edit_s: float = 0.0
    compact_s: float = 0.0

    def save(self, work: Path, index: Path) -> None:
        """Atomically: a kill leaves the previous state or this one."""
        from retriever.index.manifest import Manifest

        state = {**vars(self), "rng": self.rng.getstate(), "generation": Manifest.load(index).generation}
        (work / "state.pkl.tmp").write_bytes(pickle.dumps(state))
        os.replace(work / "state.pkl.tmp", work / "state.pkl")

    @classmethod
    def resume(cls, work: Path, index: Path, settings: dict) -> EditRun:
        """The run saved in `work`; refused where it was started with other settings or is behind its index."""
        from retriever.index.manifest import Manifest

        if not (work / "state.pkl").is_file():
            refuse(f"--resume: no saved state in {work}")
        state = pickle.loads((work / "state.pkl").read_bytes())
        if state["settings"] != settings:
            refuse(f"--resume: {work} was run with {state['settings']}, not {settings}")
        if Manifest.load(index).generation != state.pop("generation"):
            refuse(
                f"--resume: {index} is at generation {Manifest.load(index).generation}, the saved state behind it "
                "(an edit was committed but not recorded): start again"
            )
        rng = random.Random()
        rng.setstate(state.pop("rng"))
        print(f"resuming after {state['done']} edits", flush=True)
        return cls(rng=rng, **state)


def first_build(args, work: Path, index: Path, retriever, settings: dict) -> EditRun:
    """The base passages, their index at `index` and the probe's queries; a run with no edit yet."""
    import numpy as np

    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.index.compact import MAX_DEAD_FRACTION, MAX_SEGMENTS
    from retriever.index.settings import IndexSettings

    rng = random.Random(args.seed)
    live = {f"b{i}": sentence(rng, f"b{i}") for i in range(args.base)}
    prepare_corpus(
        [write_jsonl(work / "base.jsonl", list(live.values()))], work / "base-corpus", chunk_words=0, progress=False
    )
    started = time.perf_counter()
    build_index(
        work / "base-corpus",
        retriever,
        index,
        IndexSettings(spec=args.spec),
        progress=False,
        encoder_source=args.encoder,
    )
    build_s = time.perf_counter() - started
    questions = [f"when was the {rng.choice(WORDS)} of {rng.choice(PLACES)} built" for _ in range(args.queries)]
    np.save(work / "queries.npy", retriever.embed_queries(questions))
    report = {
        **{k: v for k, v in settings.items() if k != "seed"},
        "first_build_s": round(build_s, 1),
        "policy": {"max_segments": MAX_SEGMENTS, "max_dead_fraction": MAX_DEAD_FRACTION},
        "file_bound": 5 + 6 * MAX_SEGMENTS,
        "checkpoints": {},
    }
    return EditRun(settings=settings, rng=rng, live=live, report=report)


def edit_once(run: EditRun, index: Path, retriever) -> None:
    """One random edit (add 4 : update 4 : remove 2) committed to `index`, then a compaction if one is due."""
    from retriever.index.compact import compact_if_due
    from retriever.index.update import add_passages, remove_passages, update_passages

    rng, live = run.rng, run.live
    kind = rng.choices(["add", "update", "remove"], weights=[4, 4, 2])[0]
    started = time.perf_counter()
    if kind == "add" or len(live) < 2:
        record = sentence(rng, f"n{run.added}")
        run.added += 1
        add_passages(index, [record], retriever, progress=False)
        live[record["id"]] = record
    elif kind == "update":
        record = sentence(rng, rng.choice(list(live)))
        update_passages(index, [record], retriever, progress=False)
        live[record["id"]] = record
    else:
        pid = rng.choice(list(live))
        remove_passages(index, [pid])
        del live[pid]
    run.edit_s += time.perf_counter() - started
    started = time.perf_counter()
    if compact_if_due(index) is not None:
        run.compactions += 1
        run.compact_s += time.perf_counter() - started
    run.done += 1


def measure_checkpoint(args, run: EditRun, work: Path, index: Path, retriever, checkpoint: int) -> dict:
    """The edited index against a fresh build of the same live passages: the probe's figures and the counters."""
    import numpy as np

    from retriever.corpus import prepare_corpus
    from retriever.index import PassageIndex
    from retriever.index.build import build_index
    from retriever.index.manifest import Manifest
    from retriever.index.settings import IndexSettings

    fresh, fresh_corpus = work / f"fresh-{checkpoint}", work / f"fresh-corpus-{checkpoint}"
    for leftover in (fresh, fresh_corpus):  # an interrupted measurement's
        shutil.rmtree(leftover, ignore_errors=True)
    prepare_corpus(
        [write_jsonl(work / "live.jsonl", list(run.live.values()))], fresh_corpus, chunk_words=0, progress=False
    )
    build_index(
        fresh_corpus, retriever, fresh, IndexSettings(spec=args.spec), progress=False, encoder_source=args.encoder
    )
    edited_index = PassageIndex.load(index)
    rows = np.flatnonzero(~edited_index.removed)
    same_passages = sorted((p["id"], p["text"]) for p in edited_index.passages(rows)) == sorted(
        (r["id"], r["text"]) for r in run.live.values()
    )
    del edited_index
    manifest = Manifest.load(index)
    figures = measure(index, fresh, work / "queries.npy", args.encoder, args.repeats)
    figures.update(
        edits=run.done,
        compactions=run.compactions,
        live_passages=len(run.live),
        segments=len(manifest.segments),
        dead_rows=manifest.dead_rows,
        same_live_passages=same_passages,
        mean_edit_ms=round(1000 * run.edit_s / run.done, 1),
        compaction_s_total=round(run.compact_s, 1),
    )
    shutil.rmtree(fresh)
    shutil.rmtree(fresh_corpus)
    return figures


def print_table(report: dict) -> None:
    """Edited / fresh and their ratio for each figure at each checkpoint."""
    keys = ["load_ms", "load_files_ms", "search_qps", "rss_mb", "rss_untrimmed_mb", "disk_bytes", "files"]
    print(f"\n{'edits':>6} {'segs':>4} {'dead':>5} " + " ".join(f"{k + ' e/f':>24}" for k in keys))
    for checkpoint, figures in report["checkpoints"].items():
        shown = {
            side: {k: figures[side][k] / 2**20 if k == "disk_bytes" else figures[side][k] for k in keys}
            for side in ("edited", "fresh")
        }  # disk in MiB
        cells = [f"{shown['edited'][k]:>9.4g}/{shown['fresh'][k]:<9.4g}{figures['ratio'][k]:>5.2f}x" for k in keys]
        print(
            f"{checkpoint:>6} {figures['segments']:>4} {figures['dead_rows']:>5} " + " ".join(f"{c:>24}" for c in cells)
        )
    print(
        f"(disk in MiB; search_qps ratio: fresh / edited, i.e. time; target <= 1.1 for {', '.join(TARGETED)}; "
        f"file bound {report['file_bound']})"
    )


def held(report: dict) -> bool:
    """Whether every checkpoint kept the live passages, the file bound and the targeted ratios."""
    return all(
        f["same_live_passages"]
        and f["edited"]["files"] <= report["file_bound"]
        and all(f["ratio"][key] <= 1.1 for key in TARGETED)
        for f in report["checkpoints"].values()
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from atlas.index_api import index_retriever

    torch.set_num_threads(1)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="atlas-bench-edits-"))
    work.mkdir(parents=True, exist_ok=True)
    retriever = index_retriever(None, args.encoder, device="cpu")
    # the encoder is frozen here: its fingerprint (checked at every load) is computed once
    retriever.passage_fingerprint = functools.cache(retriever.passage_fingerprint)
    index = work / "edited"
    settings = {"base": args.base, "spec": args.spec, "encoder": args.encoder, "seed": args.seed}
    run = EditRun.resume(work, index, settings) if args.resume else first_build(args, work, index, retriever, settings)
    for checkpoint in sorted(args.checkpoints):
        if str(checkpoint) in run.report["checkpoints"]:
            continue  # measured before the interruption
        while run.done < checkpoint:
            edit_once(run, index, retriever)
            if args.work:
                run.save(work, index)
        figures = measure_checkpoint(args, run, work, index, retriever, checkpoint)
        run.report["checkpoints"][str(checkpoint)] = figures
        if args.work:
            run.save(work, index)
        print(json.dumps({checkpoint: figures}), flush=True)
    report = run.report
    report["machine"] = {
        "cpus": os.cpu_count(),
        "torch_threads": 1,
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    if not args.work:
        shutil.rmtree(work)
    return 0 if held(report) else 1


if __name__ == "__main__":
    sys.exit(main())
