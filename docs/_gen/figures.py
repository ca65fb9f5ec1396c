"""The results pages' figures, drawn with matplotlib from the measurements in docs/results/data/*.json.

Each figure is a function of its JSON file; `draw_all()` returns {name: SVG text} and the docs build
(`hooks.py`) serves them as results/img/NAME.svg. The SVGs are deterministic (no date, fixed ids), so a
figure changes only when its data does. To look at them outside a build:

    python docs/_gen/figures.py --out /tmp/figures
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DATA = Path(__file__).resolve().parents[1] / "results" / "data"
plt.rcParams.update(
    {
        "svg.hashsalt": "atlas-docs",
        "font.size": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
    }
)


def _load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def _svg(fig) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buffer.getvalue()


def reader_stages() -> str:
    data = _load("reader-stages")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for (decoding, d), marker, color in zip(data["decodings"].items(), "os", ("tab:blue", "tab:orange")):
        ax.plot(d["stages"], d["gold"], marker=marker, color=color, label=f"gold paragraph — {decoding}")
        ax.plot(
            d["stages"], d["among5"], marker=marker, color=color, linestyle="--", label=f"gold among 5 — {decoding}"
        )
    ax.set_xlabel("training stage of the shipped reader")
    ax.set_ylabel("SQuAD dev EM (300 questions)")
    ax.set_xticks(range(3, 9))
    ax.legend(fontsize=7.5, loc="lower right")
    return _svg(fig)


def index_compressed() -> str:
    data = _load("index-compressed")
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for name, d in data["indexes"].items():
        speed = [q / data["exact_qps"] for q in d["qps"]]
        ax.plot(speed, d["overlap"], marker="o", label=name)
        for x, y, k in zip(speed, d["overlap"], d["rerank"]) if "x4fs" in name else ():
            ax.annotate(
                "codes" if k == 0 else f"k'={k}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7
            )
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.annotate(
        "exact float16 search", (1.0, 1.0), textcoords="offset points", xytext=(4, -4), fontsize=7, color="grey"
    )
    ax.set_xscale("log")
    ax.set_xlabel("queries/s relative to exact search (log scale); points: codes alone, then re-rank k' ↑")
    ax.set_ylabel("top-100 overlap with exact search")
    ax.legend(fontsize=7.5, loc="lower left")
    return _svg(fig)


def _bars(labels: list[str], series: dict[str, list[float]], ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7.5)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="x", visible=False)
    ax.legend(fontsize=8)
    return _svg(fig)


def reading_speed() -> str:
    data = _load("reading-speed")
    return _bars(data["paths"], data["qps"], "questions/s at K = 5")


def serving() -> str:
    data = _load("serving")
    return _bars(
        data["variants"],
        {"micro-batched": data["batched"], "one at a time": data["one_at_a_time"]},
        "asks/s, 16 concurrent clients",
    )


def retriever_interpolation() -> str:
    data = _load("retriever-interpolation")
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for loss, values in data["recall_at_5"].items():
        ax.plot(data["alpha"], values, marker="o", label=f"dev, {loss}")
    ax.axhline(data["recall_at_5"]["pdist"][0], color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("α: share of the trained update of the query encoder")
    ax.set_ylabel("nq824 dev answer recall@5")
    ax.legend(fontsize=8)
    return _svg(fig)


BENCH = Path(__file__).resolve().parents[2] / "bench" / "results" / "cpu"


def scale() -> str:
    """bench/scale.py's growth curve: each cost against N (log-log), the measured points and the power law
    fitted to them, extended to 30M and 100M passages."""
    data = json.loads((BENCH / "scale.json").read_text(encoding="utf-8"))
    growth = {row["cost"]: row for row in data["growth"]}
    panels = [
        (
            "seconds",
            [
                "corpus prepare time",
                "Flat build time",
                "compressed build time",
                "add 1,000 passages",
                "add 1,000 passages, beyond embedding them",
                "compaction after the edits",
            ],
            1.0,
        ),
        (
            "GiB",
            [
                "compressed resident after load",
                "compressed build peak RSS",
                "Flat build peak RSS",
                "corpus on disk",
                "compressed index on disk",
            ],
            2**30,
        ),
        ("queries/s (batch 64)", ["Flat search, batch 64", "compressed search + re-rank, batch 64"], 1.0),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    reach = [1e6, 1e8]
    for ax, (unit, names, scale_by) in zip(axes, panels):
        for name in names:
            row = growth.get(name)
            if not row or not row["points"]:
                continue
            xs, ys = zip(*row["points"])
            line = ax.plot(xs, [y / scale_by for y in ys], marker="o", label=name)[0]
            if "exponent" in row:
                fitted = [row["coefficient"] * x ** row["exponent"] / scale_by for x in reach]
                ax.plot(reach, fitted, linestyle=":", color=line.get_color(), linewidth=1)
        if unit == "GiB":
            ax.axhline(0.8 * 24, color="grey", linewidth=0.8)
            ax.annotate("0.8 × 24 GiB", (1.1e6, 0.8 * 24), fontsize=7, color="grey", va="bottom")
        ax.axvline(30e6, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("passages N (dotted: fitted a·N^b)")
        ax.set_ylabel(unit)
        ax.legend(fontsize=6.5, loc="upper left")
    fig.tight_layout()
    return _svg(fig)


FIGURES = {
    "reader-stages": reader_stages,
    "index-compressed": index_compressed,
    "reading-speed": reading_speed,
    "serving": serving,
    "retriever-interpolation": retriever_interpolation,
    "scale": scale,
}


def draw_all() -> dict[str, str]:
    return {name: draw() for name, draw in FIGURES.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Draw the results pages' figures as SVG files.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, svg in draw_all().items():
        (args.out / f"{name}.svg").write_text(svg, encoding="utf-8")
        print(args.out / f"{name}.svg")
