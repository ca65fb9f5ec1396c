"""`atlas data`: the converters from the command line (outputs, messages, exit codes)."""

from __future__ import annotations

import json

from atlas.cli import main


def test_data_split_and_its_error(tmp_path, capsys):
    source = tmp_path / "all.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{n}", "answers": ["a"]}) + "\n" for n in range(5)))
    assert main(["data", "split", str(source), "--train", "2", "--out", str(tmp_path / "split")]) == 0
    assert capsys.readouterr().out == f"train 2  dev 3  → {tmp_path / 'split'}\n"
    assert main(["data", "split", str(source), "--train", "2", "--out", str(tmp_path / "split")]) == 2
    assert capsys.readouterr().err == (
        f"atlas data: error: {tmp_path / 'split'} already exists (use --overwrite to replace it)\n"
    )


def test_data_nq824_to_kilt(shared_data, tmp_path, capsys):
    out = tmp_path / "kilt-nq824"
    argv = [
        "data",
        "nq824-to-kilt",
        "--nq824",
        str(shared_data / "nq824"),
        "--distractors",
        str(shared_data / "wikitext2-articles.jsonl"),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out == f"train 64  dev 578  knowledge documents 820 gold + 122 distractors  → {out}\n"
    assert sorted(p.name for p in out.iterdir()) == ["dev.jsonl", "knowledge.jsonl", "train.jsonl"]


def test_data_kilt_knowledge(tmp_path, capsys):
    source = tmp_path / "kilt_knowledgesource.json"
    source.write_text(
        json.dumps({"wikipedia_id": "290", "wikipedia_title": "A", "text": ["A\n", "A letter.\n"]}) + "\n"
    )
    assert main(["data", "kilt-knowledge", str(source), "--out", str(tmp_path / "pages.jsonl")]) == 0
    assert capsys.readouterr().out == f"pages 1  → {tmp_path / 'pages.jsonl'}\n"
    assert json.loads((tmp_path / "pages.jsonl").read_text()) == {
        "id": "290",
        "title": "A",
        "text": "A letter.",
        "wikipedia_id": "290",
    }
