"""The Python API (`atlas.Atlas`, `atlas.Index`) on the shipped reader over a MiniLM index of part of the demo
encyclopedia: one answer path for Python, `atlas ask`, `atlas evaluate` and the server; save/load round trips
(a folder, a Hugging Face Hub cache snapshot, a moved run folder); read paths that write nothing; corpus edits
seen at once by every model holding the index; fine-tuning in place."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

import atlas
from atlas.cli import main
from atlas.loading import SHIPPED_READER
from common.io import read_jsonl

DEMO = Path(atlas.__file__).resolve().parent / "demo"
N_QUESTIONS = 8

pytestmark = pytest.mark.skipif(not (SHIPPED_READER / "config.json").is_file(), reason="atlas-reader not exported")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """The first held-out questions, a corpus of their gold documents and as many others, indexed by
    `atlas.Index.build`; the shipped reader loaded over it."""
    root = tmp_path_factory.mktemp("api")
    questions = [record for _, record in read_jsonl(DEMO / "heldout.jsonl")][:N_QUESTIONS]
    (root / "dev.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    gold = {q["gold_doc"] for q in questions}
    documents = [d for _, d in read_jsonl(DEMO / "encyclopedia.jsonl")]
    chosen = [d for d in documents if d["id"] in gold] + [d for d in documents if d["id"] not in gold][:N_QUESTIONS]
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in chosen), encoding="utf-8")
    index = atlas.Index.build(root / "docs.jsonl", root / "index", progress=False)
    model = atlas.Atlas.from_pretrained("atlas-reader", index=index)
    return {"root": root, "index": index, "model": model, "questions": questions, "dev": root / "dev.jsonl"}


def test_the_api_answers_with_evidence_one_or_many(world):
    model, index = world["model"], world["index"]
    question = world["questions"][0]
    one = model.answer(question["question"])
    assert isinstance(one, atlas.Answer) and one.question == question["question"]
    assert one.text in question["answers"]  # the shipped reader reads the demo passages
    assert len(one.passages) == 2  # atlas-reader's atlas.yaml: reads 2 passages
    assert [p.id for p in one.passages] == [p.id for p in index.search(model.task.query(question["question"]), k=2)]
    assert one.passages[0].score >= one.passages[1].score and one.generation == index.manifest.generation
    many = model.answer([q["question"] for q in world["questions"][:3]], k=3, with_attention=True)
    assert all(len(a.passages) == 3 for a in many)
    assert all(abs(sum(a.attention) - 1) < 1e-5 for a in many)
    with pytest.raises(ValueError, match="question 1 is empty"):
        model.answer(["ok?", "  "])


def test_answer_names_what_it_takes_and_batches_a_long_list_with_a_progress_bar(world, capsys):
    model = world["model"]
    with pytest.raises(TypeError, match=r"a question \(str\) or a list of questions \(list\[str\]\), not int: 42"):
        model.answer(42)
    with pytest.raises(ValueError, match="no questions given"):
        model.answer([])
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        model.answer(["a question?"], batch_size=0)
    questions = [q["question"] for q in world["questions"][:5]]
    capsys.readouterr()
    whole = [a.text for a in model.answer(questions, batch_size=8)]
    assert "answering" not in capsys.readouterr().err  # one batch: no bar
    batched = model.answer(questions, batch_size=2)
    assert [a.text for a in batched] == whole and [a.question for a in batched] == questions
    assert "answering" in capsys.readouterr().err  # three batches: a bar
    model.answer(questions, batch_size=2, progress=False)
    assert "answering" not in capsys.readouterr().err


def test_an_answer_prints_short_and_as_html():
    from tasks.passage import Passage

    passages = [Passage(id=f"p{n}", title=f"T{n}", text="word " * 200, score=1.0 - n / 10) for n in range(5)]
    answer = atlas.Answer("What is the capital of Biole?", "Varn", passages, attention=[0.6, 0.1, 0.1, 0.1, 0.1])
    shown = repr(answer)
    assert shown == (
        "Answer(question='What is the capital of Biole?', text='Varn', "
        "passages=['p0' (1.000), 'p1' (0.900), 'p2' (0.800), … 2 more])"
    )
    page = answer._repr_html_()
    assert page.count("<li>") == 5 and "<b>Varn</b>" in page and "attention 60%" in page and "word " * 200 not in page


def test_an_answer_shows_where_it_is_cited_in_its_repr_and_highlighted_as_escaped_html():
    from tasks.citations import find_citations
    from tasks.passage import Passage

    read = [
        Passage(id="p0", title="Other", text="Nothing here.", score=0.9),
        Passage(id="p1", title="Biole <b>", text="Biole's capital is Varn; <i>Varn</i> is old.", score=0.8),
    ]
    answer = atlas.Answer("What is the capital of Biole?", "Varn", read, citations=find_citations("Varn", read))
    assert answer.supported and [(c.start, c.end) for c in answer.citations] == [(19, 23), (28, 32)]
    assert repr(answer) == (
        "Answer(question='What is the capital of Biole?', text='Varn', cited='p1':text[19:23] +1, "
        "passages=['p0' (0.900), 'p1' (0.800)])"
    )
    page = answer._repr_html_()
    assert "<mark>Varn</mark>; &lt;i&gt;<mark>Varn</mark>&lt;/i&gt; is old." in page  # passage text never markup
    assert "Biole &lt;b&gt;" in page and "<i>" not in page
    unsupported = atlas.Answer("q", "Ostra", read, citations=find_citations("Ostra", read))
    assert not unsupported.supported and "<mark>" not in unsupported._repr_html_()
    assert not atlas.Answer("q", "Varn", []).supported  # closed book: nothing cited


def test_the_api_cites_the_passage_an_answer_is_read_from(world):
    answer = world["model"].answer("What is the capital of Biole?")
    assert answer.supported
    best = answer.citations[0]
    passage = next(p for p in answer.passages if p.id == best.passage_id)
    assert getattr(passage, best.field)[best.start : best.end] == best.quote
    assert best.quote.lower() == answer.text.lower()


def test_a_span_constrained_answer_is_cited_where_its_tokens_stand(world):
    """The shipped reader decodes spans of its passages: the citations are where the answer's tokens stand in
    them (`Reading.copied`), at the characters found here by hand."""
    model, question = world["model"], world["questions"][0]
    assert model.config.inference.span_answers  # the shipped reader's own decoding
    answer = model.answer(question["question"])
    ids = [p.id for p in answer.passages]
    reading = model.model.read([model.task.query(answer.question)], [answer.passages])
    gold = next(n for n, pid in enumerate(ids) if pid.startswith(question["gold_doc"]))  # Index.build's chunks
    start = answer.passages[gold].text.lower().index(answer.text.lower())
    assert (gold, "text", start, start + len(answer.text)) in reading.copied[0]
    assert [(c.passage_id, c.field, c.start, c.end) for c in answer.citations] == [
        (ids[n], field, a, b) for n, field, a, b in reading.copied[0]
    ]


def test_a_missing_hub_model_says_why_it_is_missing(tmp_path):
    """Online, a Hub id that is not cached and cannot be fetched is one line that does not blame HF_HUB_OFFLINE
    (before: "HF_HUB_OFFLINE is set" whether or not it was); offline, it says so."""
    import os
    import subprocess
    import sys

    script = "import atlas; atlas.Atlas.from_pretrained('someone/missing')"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_HUB_CACHE": str(tmp_path), "HF_ENDPOINT": "http://127.0.0.1:9"}  # a closed port: no network
    run = {"env": env, "capture_output": True, "text": True, "timeout": 300}
    online = subprocess.run([sys.executable, "-c", script], check=False, **run)
    assert "someone/missing: not a local folder, and not in the Hugging Face cache" in online.stderr
    assert "HF_HUB_OFFLINE" not in online.stderr and "could not be reached" in online.stderr
    env["HF_HUB_OFFLINE"] = "1"
    offline = subprocess.run([sys.executable, "-c", script], check=False, **run)
    assert "(HF_HUB_OFFLINE is set, so nothing is downloaded)" in offline.stderr


def test_python_ask_evaluate_and_the_server_give_the_same_answers(world, tmp_path, capsys):
    """One answer path: the same questions, the same answers from every front end."""
    from atlas.serve.service import AtlasService, Question

    model, questions = world["model"], [q["question"] for q in world["questions"]]
    python = [a.text for a in model.answer(questions)]
    out = tmp_path / "eval"
    argv = ["evaluate", "atlas-reader", "--index", str(world["index"].path), "--data", str(world["dev"])]
    assert main([*argv, "--out", str(out)]) == 0
    evaluated = [json.loads(line)["prediction"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert evaluated == python
    metrics = model.evaluate(world["dev"], progress=False)
    assert metrics == json.loads((out / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["ask", "atlas-reader", "--index", str(world["index"].path), questions[1]]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"A: {python[1]}"
    service = AtlasService(model, auto_compact=False)
    try:
        served = service.answer([Question(q, model.model.n_read) for q in questions])
    finally:
        service.close()
    assert [s["answer"] for s in served] == python


def test_save_pretrained_round_trips_and_a_hub_snapshot_loads_offline(world, tmp_path, monkeypatch):
    model, questions = world["model"], [q["question"] for q in world["questions"][:4]]
    folder = model.save_pretrained(tmp_path / "saved")
    assert {p.name for p in folder.iterdir()} == {"README.md", "config.yaml", "reader", "retriever"}
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: atlas\n") and "\n---\n" in card
    assert (folder / "reader" / "model.safetensors").is_file() and (folder / "reader" / "tokenizer.json").is_file()
    with pytest.raises(FileExistsError, match="already exists"):
        model.save_pretrained(folder)
    want = [a.text for a in model.answer(questions)]
    again = atlas.Atlas.from_pretrained(folder, index=world["index"])
    assert [a.text for a in again.answer(questions)] == want
    assert again.config.inference == model.config.inference  # it answers as it was saved

    # a Hub model repository as huggingface_hub caches it: refs/main names the snapshot holding the folder
    cache = tmp_path / "hub"
    repo = cache / "models--someone--atlas-demo"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = atlas.Atlas.from_pretrained("someone/atlas-demo", index=world["index"])
    assert [a.text for a in hub.answer(questions)] == want
    with pytest.raises(FileNotFoundError, match="someone/missing: not a local folder, and not in the Hugging Face"):
        atlas.Atlas.from_pretrained("someone/missing", index=world["index"])


def test_a_moved_run_folder_finds_its_index_or_says_what_is_missing(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world["index"].path, run / "index")
    shutil.copytree(world["index"].path.parent / "index-corpus", run / "index-corpus")
    atlas.Atlas.from_pretrained("atlas-reader", index=run / "index").save_pretrained(run / "model")
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    run.rename(moved)
    question = world["questions"][0]["question"]
    assert main(["ask", str(moved / "model"), question]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"A: {world['model'].answer(question).text}"
    shutil.rmtree(moved / "index")
    assert main(["ask", str(moved / "model"), question]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "the index it was run with is missing" in error and "--index IDX" in error


def test_read_paths_write_nothing_and_never_build_an_index(world, tmp_path):
    from atlas.config import load_config, save_config

    folder = world["model"].save_pretrained(tmp_path / "saved")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    model = atlas.Atlas.from_pretrained(folder, index=world["index"])
    model.answer(world["questions"][0]["question"])
    model.evaluate(world["dev"], max_examples=2, progress=False)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    # a run whose index would be built from its corpus: loading it to answer does not build it
    config = load_config(folder / "config.yaml", ["index.path=null", f"index.corpus={tmp_path / 'corpus'}"])
    save_config(config, folder / "config.yaml")
    with pytest.raises(FileNotFoundError, match="the index it was run with is missing"):
        atlas.Atlas.from_pretrained(folder)
    assert not (folder / "index").exists() and not (tmp_path / "corpus").exists()


def test_an_edit_through_the_index_is_seen_at_once_by_every_model_holding_it(world, tmp_path):
    shutil.copytree(world["index"].path, tmp_path / "index")
    index = atlas.Index.load(tmp_path / "index")
    first = atlas.Atlas.from_pretrained("atlas-reader", index=index)
    second = atlas.Atlas.from_pretrained("atlas-reader", index=index)
    question = world["questions"][0]
    top = first.answer(question["question"]).passages[0]
    old = question["answers"][0]
    assert old in top.text
    stats = index.update([{"id": top.id, "text": top.text.replace(old, "Quillmoor")}])
    assert stats.replaced == 1 and index.get(top.id).text == top.text.replace(old, "Quillmoor")
    assert index.get(top.id).title == top.title  # an update without a title keeps the passage's
    assert first.answer(question["question"]).text == second.answer(question["question"]).text == "Quillmoor"
    n = len(index)
    index.add([{"id": "new-1", "title": "Zed", "text": "Zed is a town."}])
    assert len(index) == n + 1 and index.search("Zed is a town", k=1)[0].id == "new-1"
    index.remove(["new-1"])
    assert len(index) == n and index.remove(["new-1"]).already_removed == 1
    with pytest.raises(KeyError, match="never-there"):
        index.remove(["never-there"])


def test_fit_trains_the_model_in_place_with_the_recipe(world, tmp_path):
    import torch

    model = atlas.Atlas.from_pretrained("atlas-reader", index=world["index"])
    before = {k: v.clone() for k, v in model.model.reader.state_dict().items()}
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for _, r in list(read_jsonl(DEMO / "train.jsonl"))[:8]))
    summary = model.fit(train, steps=2, overrides=["training.batch_size=2", "training.log_every=1"], progress=False)
    assert summary["step"] == 2 and len(summary["losses"]) == 2 and summary["checkpoint"] is None
    after = model.model.reader.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # trained, in place
    assert not model.model.training  # ready to answer again
    assert not any(p.name.startswith("atlas-fit-") for p in Path(tempfile.gettempdir()).iterdir())
