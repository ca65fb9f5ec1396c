"""bench/index_edits.py's edit loop: an interrupted run resumed from its saved state makes the
same edits as an uninterrupted one, and a state that no longer matches its index is refused.
(The probes, timed in fresh processes, are replaced by a stand-in: only the loop is tested.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from retriever.index import PassageIndex
from retriever.index.update import remove_passages

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_index_edits", REPO / "bench" / "index_edits.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    measured = []

    def measure(edited, fresh, queries, encoder, repeats):
        measured.append(len(PassageIndex.load(fresh)))
        figures = dict.fromkeys(["load_ms", "load_files_ms", "search_qps", "rss_mb", "rss_untrimmed_mb"], 1.0)
        sides = {
            side: {**figures, "disk_bytes": 1, "files": module.footprint(folder)[1]}
            for side, folder in (("edited", edited), ("fresh", fresh))
        }
        return {**sides, "ratio": dict.fromkeys([*figures, "disk_bytes", "files"], 1.0)}

    monkeypatch.setattr(module, "measure", measure)
    module.measured = measured
    return module


def _live(folder: Path) -> list[tuple[str, str]]:
    index = PassageIndex.load(folder)
    return sorted(
        (p["id"], p["text"]) for p in index.passages([i for i in range(index.manifest.total) if not index.removed[i]])
    )


def test_a_resumed_run_makes_the_same_edits_and_a_mismatched_state_is_refused(bench, tmp_path, capsys):
    common = ["--base", "30", "--queries", "4", "--repeats", "1"]
    assert (
        bench.main(
            [
                *common,
                "--checkpoints",
                "6",
                "14",
                "--work",
                str(tmp_path / "whole"),
                "--out",
                str(tmp_path / "whole.json"),
            ]
        )
        == 0
    )
    assert bench.main([*common, "--checkpoints", "6", "--work", str(tmp_path / "cut")]) == 0
    assert len(bench.measured) == 3  # two checkpoints, then one
    assert (
        bench.main(
            [
                *common,
                "--checkpoints",
                "6",
                "14",
                "--work",
                str(tmp_path / "cut"),
                "--resume",
                "--out",
                str(tmp_path / "cut.json"),
            ]
        )
        == 0
    )
    assert len(bench.measured) == 4  # checkpoint 6 was not measured again
    assert bench.measured[1] == bench.measured[3]  # the fresh builds at 14 edits: as many live passages
    assert _live(tmp_path / "cut" / "edited") == _live(tmp_path / "whole" / "edited")
    whole, cut = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("whole", "cut"))
    for report in (whole, cut):
        assert [c["edits"] for c in report["checkpoints"].values()] == [6, 14]
        assert all(c["same_live_passages"] for c in report["checkpoints"].values())
    assert [c["live_passages"] for c in cut["checkpoints"].values()] == [
        c["live_passages"] for c in whole["checkpoints"].values()
    ]

    # an edit the saved state does not know of: resuming would lose track of the live passages
    remove_passages(tmp_path / "cut" / "edited", [_live(tmp_path / "cut" / "edited")[0][0]])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        bench.main([*common, "--checkpoints", "20", "--work", str(tmp_path / "cut"), "--resume"])
    assert "an edit was committed but not recorded" in capsys.readouterr().err
