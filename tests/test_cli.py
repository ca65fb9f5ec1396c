"""The `atlas` command line: help, the corpus commands and honest errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atlas.cli import main


def test_help_lists_every_subcommand(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in ("corpus", "index", "train", "evaluate", "ask", "quickstart"):
        assert command in out


def test_console_script_runs_as_module():
    result = subprocess.run([sys.executable, "-m", "atlas", "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "corpus" in result.stdout


def test_corpus_prepare_prints_counts(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"id": "a", "title": "A", "text": " ".join(["w"] * 250)}) + "\n")
    assert main(["corpus", "prepare", str(src), "--out", str(tmp_path / "c"), "--chunk-words", "100"]) == 0
    out = capsys.readouterr().out
    assert "documents 1  passages 3  words 250  skipped 0" in out
    assert main(["corpus", "info", str(tmp_path / "c")]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 3


def test_bad_input_is_one_clear_error_and_exit_code_2(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"id": "a", "text": "ok"}\n{"id": "b"}\n')
    assert main(["corpus", "prepare", str(src), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert f"atlas corpus: error: {src}:2: field 'text': missing required field" in err
    assert not (tmp_path / "c").exists()


def test_overrides_after_options_are_collected(monkeypatch):
    from atlas import cli

    seen = {}
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    evaluate = parser._subparsers._group_actions[0].choices["evaluate"]
    evaluate.set_defaults(func=lambda args: seen.setdefault("args", args) and 0)
    assert main(["evaluate", "run", "--data", "d.jsonl", "evaluation.batch_size=32", "task.shots=4"]) == 0
    assert seen["args"].overrides == ["evaluation.batch_size=32", "task.shots=4"]
    with pytest.raises(SystemExit):
        main(["evaluate", "run", "--data", "d.jsonl", "--nope"])
