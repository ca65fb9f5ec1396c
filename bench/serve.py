"""`atlas serve` under load on loopback: micro-batched against one-at-a-time, with live edits.

    python bench/serve.py                     # 1,000 asks at concurrency 16 + 100 edits, K=5
    python bench/serve.py --asks 200 --baseline-asks 64 --edits 10   # a quick look
    python bench/serve.py --asks 10000 --edits 1000 --baseline-asks 0  # compaction under load only
    python bench/serve.py --asks 10000 --edits 1000 --baseline-asks 0 --no-compaction-asks 2000 -k 1
    python bench/serve.py --heavy-beside-light    # light asks beside one heavy request (the request budget)

Serves the demo run (the shipped atlas-reader over the demo encyclopedia, `atlas.serve.demo`)
as `atlas serve` subprocesses on 127.0.0.1, asked the demo's held-out questions at K=5 by
`--concurrency` clients:
  1. the load test: micro-batched (--max-batch 32), `--asks` questions while `--edits` corpus
     edits are made (adds, rewrites and removals of passages it added, see `edit_plan`), with
     the automatic compactions they trigger; afterwards every edit must be visible (a removed
     passage gone), the index size must add up and `atlas index info --verify` must pass;
  1b. the same load on a server started with --no-auto-compact: the p99 latency with compaction
     against without (target: <= 1.5x). `--no-compaction-asks N` makes that run N asks long, with
     the edits in the same proportion (N x edits / asks), run first: on a slow machine a shorter
     comparison, and a stricter one (its index has fewer segments to load at each edit's swap);
  2. and 3. the throughput ratio, like against like (no edits, `--baseline-asks` each):
     micro-batched, then one question per forward pass (--max-batch 1).
`--asks 0` skips the load tests, `--baseline-asks 0` the throughput ratio. `--heavy-beside-light` runs only
the request-budget test (`heavy_beside_light_runs`): light asks alone, beside a request over the budget,
and beside the heaviest one within it. Prints JSON, then a
table with the ratios; `--out FILE` also writes the JSON, rewritten after each server's run.
Defaults: greedy decoding (`--beams 1`; the demo run's own recipe decodes with beam search of 4:
`--beams 4` measures that) and one torch thread per server (--threads 1: on a shared 2-core
machine more threads only contend; `--threads 2` on an idle one).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
TOKEN = "bench-edit-token-0123"  # the edit token of the servers started here (ATLAS_TOKEN)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen | None = None, timeout: float = 180.0) -> dict:
    """Poll GET /api/health until it answers 200 (→ its JSON); RuntimeError when the server died
    or did not come up within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before it was ready")
        try:
            response = httpx.get(f"{url}/api/health", timeout=2.0)
            if response.status_code == 200:
                return response.json()
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy within {timeout:.0f} s")


def start_server(
    run: Path,
    index: Path,
    *,
    port: int,
    max_batch: int,
    threads: int = 1,
    overrides: tuple[str, ...] = ("inference.num_beams=1",),
    log: Path | None = None,
    auto_compact: bool = True,
) -> subprocess.Popen:
    """`atlas serve RUN --index INDEX --allow-edits` on 127.0.0.1:`port` as a subprocess; edits need `TOKEN`."""
    command = [
        sys.executable,
        "-m",
        "atlas",
        "serve",
        str(run),
        *overrides,
        "--index",
        str(index),
        "--port",
        str(port),
        "--allow-edits",
        "--max-batch",
        str(max_batch),
        "--threads",
        str(threads),
        *([] if auto_compact else ["--no-auto-compact"]),
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": str(threads),
        "ATLAS_TOKEN": TOKEN,
    }
    output = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT)


def edit_plan(n_edits: int, tag: str) -> list[tuple[str, str, dict | None]]:
    """`n_edits` edits in blocks of six: add passages `{tag}-i` (made-up facts) three times,
    rewrite the one added just before twice, and remove the first one of the block (so that
    dead rows pile up as well as segments). → [(method, path, body or None)]."""
    plan = []
    for n in range(n_edits):
        if n % 6 in (2, 4):
            pid = f"{tag}-{n - 1}"
            plan.append(
                (
                    "PUT",
                    f"/api/passages/{pid}",
                    {"text": f"The lighthouse of {pid} was rebuilt in {1900 + n} by Orla Venn."},
                )
            )
        elif n % 6 == 5:
            plan.append(("DELETE", f"/api/passages/{tag}-{n - 5}", None))
        else:
            pid = f"{tag}-{n}"
            plan.append(
                (
                    "POST",
                    "/api/passages",
                    {
                        "passages": [
                            {
                                "id": pid,
                                "title": pid,
                                "text": f"The lighthouse of {pid} was built in {1700 + n} by Ivo Marr.",
                            }
                        ]
                    },
                )
            )
    return plan


def expected_texts(plan: list[tuple[str, str, dict | None]]) -> dict[str, str | None]:
    """The text each edited passage must have once the whole plan has been applied in order
    (None: removed)."""
    final: dict[str, str | None] = {}
    for method, path, body in plan:
        if method == "POST":
            final.update({p["id"]: p["text"] for p in body["passages"]})
        else:
            final[path.rsplit("/", 1)[1]] = body["text"] if method == "PUT" else None
    return final


async def _load(
    url: str,
    questions: list[str],
    asks: int,
    concurrency: int,
    k: int,
    plan: list[tuple[str, str, dict]],
    token: str | None,
    timeout: float,
) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    edit_errors: list[str] = []
    batch_sizes: list[int] = []
    next_ask = 0
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def asker(client: httpx.AsyncClient) -> None:
        nonlocal next_ask
        while next_ask < asks:
            n, next_ask = next_ask, next_ask + 1
            started = time.perf_counter()
            try:
                response = await client.post("/api/ask", json={"question": questions[n % len(questions)], "k": k})
            except httpx.HTTPError as e:
                errors.append(f"ask {n}: {type(e).__name__}: {e}")
                continue
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                errors.append(f"ask {n}: HTTP {response.status_code}: {response.text[:200]}")
            else:
                batch_sizes.append(response.json()["batch_size"])

    async def editor(client: httpx.AsyncClient) -> None:
        for n, (method, path, body) in enumerate(plan):
            while next_ask < (n + 1) * asks // (len(plan) + 1):  # spread the edits over the run
                await asyncio.sleep(0.01)
            response = await client.request(method, path, json=body, headers=headers)
            if response.status_code != 200:
                edit_errors.append(f"edit {n} {method} {path}: HTTP {response.status_code}: {response.text[:200]}")

    async with httpx.AsyncClient(
        base_url=url, timeout=timeout, limits=httpx.Limits(max_connections=concurrency + 4)
    ) as client:
        started = time.perf_counter()
        await asyncio.gather(*(asker(client) for _ in range(concurrency)), editor(client))
        wall = time.perf_counter() - started
    ms = np.array(latencies) * 1000
    return {
        "asks": asks,
        "concurrency": concurrency,
        "k": k,
        "edits": len(plan),
        "errors": len(errors),
        "edit_errors": len(edit_errors),
        "error_examples": (errors + edit_errors)[:5],
        "wall_s": round(wall, 2),
        "throughput_per_s": round(asks / wall, 2),
        "p50_ms": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
        "p99_ms": round(float(np.percentile(ms, 99)), 1) if len(ms) else None,
        "mean_batch": round(float(np.mean(batch_sizes)), 2) if batch_sizes else None,
    }


def load_test(
    url: str,
    questions: list[str],
    *,
    asks: int,
    concurrency: int,
    k: int = 5,
    plan: list[tuple[str, str, dict]] = (),
    token: str | None = None,
    timeout: float = 300.0,
) -> dict:
    """Ask `asks` questions (cycling through `questions`) from `concurrency` concurrent clients
    while applying the edits of `plan` spread over the run. → counts of errors, wall time,
    throughput (asks/s), p50/p99 latency (ms, as the clients saw it), mean micro-batch size."""
    return asyncio.run(_load(url, questions, asks, concurrency, k, list(plan), token, timeout))


async def _heavy_beside_light(
    url: str, questions: list[str], heavy: dict | None, *, light_asks: int, concurrency: int, k: int, timeout: float
) -> dict:
    light_ms: list[float] = []
    errors: list[str] = []
    heavy_result: dict = {}
    next_ask = 0

    async with httpx.AsyncClient(
        base_url=url, timeout=timeout, limits=httpx.Limits(max_connections=concurrency + 2)
    ) as client:

        async def send_heavy() -> None:
            started = time.perf_counter()
            response = await client.post("/api/ask/batch", json=heavy)
            heavy_result.update(
                heavy_status=response.status_code,
                heavy_ms=round(1000 * (time.perf_counter() - started), 1),
                heavy_detail=response.json().get("detail") if response.status_code != 200 else None,
            )

        async def asker() -> None:
            nonlocal next_ask
            while next_ask < light_asks:
                n, next_ask = next_ask, next_ask + 1
                started = time.perf_counter()
                response = await client.post("/api/ask", json={"question": questions[n % len(questions)], "k": k})
                light_ms.append(1000 * (time.perf_counter() - started))
                if response.status_code != 200:
                    errors.append(f"ask {n}: HTTP {response.status_code}: {response.text[:200]}")

        heavy_task = asyncio.create_task(send_heavy()) if heavy is not None else None
        if heavy_task is not None:
            await asyncio.sleep(0.2)  # the heavy request is in (and, when admitted, its first batch runs)
        started = time.perf_counter()
        await asyncio.gather(*(asker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        if heavy_task is not None:
            await heavy_task
    ms = np.array(light_ms)
    return {
        "light_asks": light_asks,
        "light_errors": len(errors),
        "error_examples": errors[:3],
        "light_p50_ms": round(float(np.percentile(ms, 50)), 1),
        "light_p99_ms": round(float(np.percentile(ms, 99)), 1),
        "light_wall_s": round(wall, 2),
        "heavy_questions": len(heavy["questions"]) if heavy else 0,
        "heavy_k": heavy["k"] if heavy else None,
        **heavy_result,
    }


def heavy_beside_light(
    url: str,
    questions: list[str],
    heavy: dict | None,
    *,
    light_asks: int = 32,
    concurrency: int = 4,
    k: int = 5,
    timeout: float = 300.0,
) -> dict:
    """One heavy `/api/ask/batch` request (`heavy`: its body; None: none) sent first, then `light_asks`
    one-question asks from `concurrency` clients. → the light asks' p50/p99 latency (ms) and errors, and the
    heavy request's status, latency and refusal detail."""
    return asyncio.run(
        _heavy_beside_light(url, questions, heavy, light_asks=light_asks, concurrency=concurrency, k=k, timeout=timeout)
    )


def heavy_beside_light_runs(run: Path, pristine_index: Path, work: Path, *, threads: int, beams: int, k: int) -> dict:
    """The load test of the request budget on one `atlas serve` with its default limits: light asks alone,
    beside the issue's request (64 questions of 2,000 characters at k=20: over the budget, refused), and
    beside the heaviest requests within the budget (64 short questions at k=10, 32 of 200 characters at k=20:
    sliced across batches, the light asks in batches of their own)."""
    index = work / "index-heavy"
    shutil.rmtree(index, ignore_errors=True)
    shutil.copytree(pristine_index, index)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_server(
        run,
        index,
        port=port,
        max_batch=32,
        threads=threads,
        overrides=(f"inference.num_beams={beams}",),
        log=work / "server-heavy.log",
    )
    questions = heldout_questions()
    long_question = (questions[0] + " ") * (2000 // (len(questions[0]) + 1))
    long_question += "x" * (2000 - len(long_question))
    rows = {}
    try:
        wait_healthy(url, process)
        heavy_beside_light(url, questions[:8], None, light_asks=8, concurrency=4, k=k)  # warm-up
        rows["light asks alone"] = heavy_beside_light(url, questions, None, k=k)
        rows["beside 64 x 2,000 chars x k=20"] = heavy_beside_light(
            url, questions, {"questions": [long_question] * 64, "k": 20}, k=k
        )
        rows["beside 64 x k=10 (the budget)"] = heavy_beside_light(
            url, questions, {"questions": questions[:64], "k": 10}, k=k
        )
        rows["beside 32 x 200 chars x k=20 (the budget)"] = heavy_beside_light(
            url, questions, {"questions": [long_question[:200]] * 32, "k": 20}, k=k
        )
    finally:
        process.terminate()
        process.wait(timeout=60)
    return rows


def check_edits(url: str, plan: list[tuple[str, str, dict | None]], passages_before: int) -> dict:
    """After a load test: every edited passage has its final text (a removed one answers 404),
    and the live count adds up. → {"lost_edits": [...ids], "passages": n, "expected_passages": n,
    "compactions": n, "segments": n, "dead_rows": n}."""
    final = expected_texts(plan)
    lost = []
    for pid, text in final.items():
        response = httpx.get(f"{url}/api/passages/{pid}", timeout=30)
        if (response.status_code == 404) != (text is None) or (text is not None and response.json()["text"] != text):
            lost.append(pid)
    health = httpx.get(f"{url}/api/health", timeout=30).json()
    return {
        "lost_edits": lost,
        "passages": health["passages"],
        "expected_passages": passages_before + sum(text is not None for text in final.values()),
        "compactions": health["compactions"],
        "segments": health["segments"],
        "dead_rows": health["dead_rows"],
    }


def heldout_questions(limit: int = 200) -> list[str]:
    """The demo's held-out questions (the ones the bench asks)."""
    from atlas.demo.quickstart import DEMO

    lines = (DEMO / "heldout.jsonl").read_text().splitlines()[:limit]
    return [json.loads(line)["question"] for line in lines]


def _serve_and_load(
    run: Path,
    pristine_index: Path,
    work: Path,
    *,
    max_batch: int,
    asks: int,
    concurrency: int,
    k: int,
    n_edits: int,
    threads: int,
    beams: int = 1,
    auto_compact: bool = True,
) -> dict:
    name = f"batch{max_batch}-edits{n_edits}" + ("" if auto_compact else "-no-compaction")
    index = work / f"index-{name}"
    shutil.rmtree(index, ignore_errors=True)
    shutil.copytree(pristine_index, index)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_server(
        run,
        index,
        port=port,
        max_batch=max_batch,
        threads=threads,
        overrides=(f"inference.num_beams={beams}",),
        log=work / f"server-{name}.log",
        auto_compact=auto_compact,
    )
    try:
        before = wait_healthy(url, process)["passages"]
        questions = heldout_questions()
        load_test(url, questions[:8], asks=2 * concurrency, concurrency=concurrency, k=k)  # warm-up
        plan = edit_plan(n_edits, f"bench{max_batch}")
        result = load_test(url, questions, asks=asks, concurrency=concurrency, k=k, plan=plan, token=TOKEN)
        if plan:
            result.update(check_edits(url, plan, before))
    finally:
        process.terminate()
        process.wait(timeout=60)
    if plan:
        verify = subprocess.run(
            [sys.executable, "-m", "atlas", "index", "info", "--index", str(index), "--verify"], check=False
        )
        result["index_verifies"] = verify.returncode == 0
    return {"max_batch": max_batch, "auto_compact": auto_compact, **result}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--asks", type=int, default=1000, help="asks to the micro-batched server")
    parser.add_argument(
        "--baseline-asks",
        type=int,
        default=160,
        help="asks to the one-at-a-time server (a rate: fewer asks measure it as well)",
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--edits", type=int, default=100, help="edits during the micro-batched run")
    parser.add_argument(
        "--no-compaction-asks",
        type=int,
        default=None,
        help="asks of the comparison run without compaction (default: --asks), edits in proportion",
    )
    parser.add_argument("--out", help="also write the JSON report here")
    parser.add_argument("-k", type=int, default=5, help="passages read per question")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    parser.add_argument("--beams", type=int, default=1, help="beam search width of the reader (1 = greedy)")
    parser.add_argument("--work", help="folder for the demo run and the servers' logs (default: a temporary one)")
    parser.add_argument(
        "--heavy-beside-light",
        action="store_true",
        help="only the request-budget load test: light asks alone, beside an over-budget request, and beside "
        "the heaviest request within the budget (concurrency 4, 32 light asks each)",
    )
    return parser.parse_args(argv)


def write_json(out: str | None, report: dict) -> None:
    """Writes `report` to --out, when given."""
    if out:
        Path(out).write_text(json.dumps(report, indent=2) + "\n")


def machine(args: argparse.Namespace) -> dict:
    """The report's `machine`: CPUs, torch threads per server, the date (UTC)."""
    return {
        "cpus": os.cpu_count(),
        "threads_per_server": args.threads,
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }


def server_runs(run: Path, work: Path, args: argparse.Namespace) -> dict[str, dict]:
    """The load tests (with and without compaction) and the throughput pair → {server name: its row}, in the
    table's order; --out rewritten after each server's run."""
    rows = {}
    common = {"concurrency": args.concurrency, "k": args.k, "threads": args.threads, "beams": args.beams}
    serve = functools.partial(_serve_and_load, run, work / "demo" / "index", work, **common)

    def record(name: str, **settings) -> None:
        rows[name] = serve(**settings)
        write_json(args.out, rows)  # what is measured so far, should a later run fail

    if args.asks:
        if args.edits:  # the comparison first: the shorter one, when --no-compaction-asks is given
            asks = args.no_compaction_asks or args.asks
            n_edits = round(args.edits * asks / args.asks)
            record("same, no compaction", max_batch=32, asks=asks, n_edits=n_edits, auto_compact=False)
        record("load test (batched + edits)", max_batch=32, asks=args.asks, n_edits=args.edits)
        if args.edits:  # the table's order: the load test first
            rows["same, no compaction"] = rows.pop("same, no compaction")
    if args.baseline_asks:
        record("micro-batched", max_batch=32, asks=args.baseline_asks, n_edits=0)
        record("one-at-a-time", max_batch=1, asks=args.baseline_asks, n_edits=0)
    return rows


def print_table(rows: dict[str, dict], report: dict, args: argparse.Namespace) -> None:
    print(
        f"\n{'server':<30}{'asks':>6}{'edits':>6}{'errors':>7}{'lost':>5}{'compact':>8}{'ask/s':>7}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'batch':>6}"
    )
    for name, row in rows.items():
        print(
            f"{name:<30}{row['asks']:>6}{row['edits']:>6}{row['errors'] + row['edit_errors']:>7}"
            f"{len(row.get('lost_edits', [])):>5}{row.get('compactions', 0):>8}{row['throughput_per_s']:>7.2f}"
            f"{row['p50_ms']:>8.0f}{row['p99_ms']:>8.0f}{row['mean_batch']:>6.1f}"
        )
    load = rows.get("load test (batched + edits)", {})
    print(
        f"concurrency {args.concurrency}, K={args.k}, beams {args.beams}, {args.threads} thread(s) per server"
        + (f"; throughput ratio {report['throughput_ratio']:.2f}x (target >= 2x)" if args.baseline_asks else "")
        + (
            f"; p99 with compaction / without {report['p99_ratio_with_compaction']:.2f}x (target <= 1.5x)"
            if "p99_ratio_with_compaction" in report
            else ""
        )
        + (
            f"; load test: {load['edits']} edits, {load['compactions']} compactions, lost: "
            f"{len(load['lost_edits'])}, index size {load['passages']}/{load['expected_passages']}, "
            f"index verifies: {load['index_verifies']}"
            if load.get("edits")
            else ""
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Run both configurations, print JSON and a table; exit 1 on any error or lost edit."""
    args = parse_args(argv)

    from atlas.serve.demo import build_demo_run

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="atlas-bench-serve-"))
    run = build_demo_run(work / "demo")
    if args.heavy_beside_light:
        return _report_heavy_beside_light(run, work, args)
    rows = server_runs(run, work, args)
    report = {**rows, "beams": args.beams, "machine": machine(args), "work": str(work)}
    if args.baseline_asks:
        ratio = rows["micro-batched"]["throughput_per_s"] / rows["one-at-a-time"]["throughput_per_s"]
        report.update(throughput_ratio=round(ratio, 2), target_ratio=2.0)
    if "same, no compaction" in rows:
        p99 = rows["load test (batched + edits)"]["p99_ms"] / rows["same, no compaction"]["p99_ms"]
        report.update(p99_ratio_with_compaction=round(p99, 3), target_p99_ratio=1.5)
    print(json.dumps(report, indent=2))
    write_json(args.out, report)
    print_table(rows, report, args)
    failed = any(
        row["errors"]
        or row["edit_errors"]
        or row.get("lost_edits")
        or row.get("passages") != row.get("expected_passages")
        or row.get("index_verifies") is False
        for row in rows.values()
    )
    return 1 if failed else 0


def _report_heavy_beside_light(run: Path, work: Path, args: argparse.Namespace) -> int:
    rows = heavy_beside_light_runs(run, work / "demo" / "index", work, threads=args.threads, beams=args.beams, k=args.k)
    report = {**rows, "k": args.k, "beams": args.beams, "machine": machine(args)}
    print(json.dumps(report, indent=2))
    write_json(args.out, report)
    print(f"\n{'light asks':<32}{'p50 ms':>8}{'p99 ms':>8}{'errors':>7}  heavy request")
    for name, row in rows.items():
        heavy = f"{row['heavy_status']} in {row['heavy_ms']:,.0f} ms" if "heavy_status" in row else "none"
        print(f"{name:<32}{row['light_p50_ms']:>8.0f}{row['light_p99_ms']:>8.0f}{row['light_errors']:>7}  {heavy}")
    alone = rows["light asks alone"]["light_p99_ms"]
    print(", ".join(f"{name}: p99 {row['light_p99_ms'] / alone:.2f}x alone" for name, row in list(rows.items())[1:]))
    return 1 if any(row["light_errors"] for row in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
