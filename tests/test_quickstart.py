"""The shipped demo, the shipped atlas-reader and `atlas quickstart` end to end (--tiny)."""

from __future__ import annotations

import json
import shutil

import pytest

from atlas.demo import make_demo
from atlas.demo.quickstart import (
    DEMO,
    RECIPE,
    SHIPPED_READER,
    edit_passages,
    run_quickstart,
    split_questions,
    summary_lines,
)
from common.io import read_jsonl
from tasks.counterfactual import replace_fact, states
from tasks.metrics import has_answer, wilson_interval

DEMO_FILES = ("encyclopedia.jsonl", "train.jsonl", "heldout.jsonl")


def _records(name: str) -> list[dict]:
    return [record for _, record in read_jsonl(DEMO / name)]


def test_the_shipped_demo_is_exactly_what_the_generator_writes(tmp_path):
    assert make_demo.main(["--out", str(tmp_path)]) == 0
    for name in DEMO_FILES:
        assert (tmp_path / name).read_bytes() == (DEMO / name).read_bytes(), name


def test_every_answer_is_in_its_gold_passage_and_the_splits_do_not_overlap():
    passages = {p["id"]: p for p in _records("encyclopedia.jsonl")}
    train, heldout = _records("train.jsonl"), _records("heldout.jsonl")
    assert len(train) == make_demo.N_TRAIN and len(heldout) >= 300
    for question in train + heldout:
        assert has_answer(question["answers"], passages[question["gold_doc"]]["text"]), question
    assert not {q["question"] for q in train} & {q["question"] for q in heldout}


def test_replace_fact_replaces_whole_words_in_any_case_only():
    assert replace_fact("Tin and tinsel; TIN.", "tin", "salt") == "salt and tinsel; salt."
    with pytest.raises(ValueError, match="'copper' does not occur"):
        replace_fact("Tin and tinsel.", "copper", "salt")


def tiny_atlas(tiny_world, index):
    """`atlas.Atlas` over a random t5-tiny reader and the tiny world's encoder, reading the index at `index`."""
    from atlas.api import Atlas
    from atlas.config import load_config
    from atlas.loading import load_model, recipe_spec

    config = load_config(
        None,
        [
            f"retriever.model={tiny_world['encoder']}",
            f"index.path={index}",
            "reader.model=t5-tiny",
            "retriever.loss=none",
        ],
    )
    return Atlas(load_model(recipe_spec(config)), config)


def test_edit_passage_updates_the_index_in_place(tiny_world, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(tiny_world["index"], index)
    model = tiny_atlas(tiny_world, index)
    passage = model.index.current.corpora[0].get("p1")
    [change] = edit_passages(model, [(passage, "Quimper", "Lorient")], tmp_path / "edit", progress=False)
    assert change["after"] == "The capital of Zorbland is Lorient. Zorbland is an island."
    hits = model.index.search("The capital of Zorbland", 5)
    texts = {hit.id: hit.text for hit in hits}
    assert len(model.index) == 5 and texts["p1"] == change["after"]
    assert not any("Quimper" in text for text in texts.values())


def test_edit_passages_updates_several_passages_in_one_index_update(tiny_world, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(tiny_world["index"], index)
    model = tiny_atlas(tiny_world, index)
    corpus = model.index.current.corpora[0]
    changes = edit_passages(
        model,
        [(corpus.get("p1"), "Quimper", "Lorient"), (corpus.get("p3"), "florin", "ducat")],
        tmp_path / "edit",
        progress=False,
    )
    assert [c["id"] for c in changes] == ["p1", "p3"]
    texts = {hit.id: hit.text for hit in model.index.search("capital", 5)}
    assert len(model.index) == 5 and "Lorient" in texts["p1"] and "ducat" in texts["p3"]
    with pytest.raises(ValueError, match="edited once per call"):
        edit_passages(
            model,
            [(corpus.get("p2"), "Olo", "X"), (corpus.get("p2"), "Tarsia", "Y")],
            tmp_path / "edit",
            progress=False,
        )


def test_the_recipe_is_valid_and_ships_once():
    from atlas.config import load_config

    config = load_config(RECIPE)
    assert config.reader.model == "atlas/demo/atlas-reader" and config.task.name == "qa"
    # the package's own copy is the recipe: no second one under configs/ to drift from it
    assert not (DEMO.parents[1] / "configs" / "quickstart.yaml").exists()


needs_mini = pytest.mark.skipif(not (SHIPPED_READER / "config.json").is_file(), reason="atlas-reader not exported")


@needs_mini
def test_the_shipped_reader_is_a_small_fp16_delta_and_matches_its_card():
    """The files and the card's counts; the card's reading figure: the slow test below."""
    from safetensors.torch import load_file

    from reader.fid import FiDReader

    stored = load_file(str(SHIPPED_READER / "model.safetensors"))
    assert {t.dtype for t in stored.values()} == {__import__("torch").float16}
    assert sum(f.stat().st_size for f in SHIPPED_READER.iterdir()) <= 35 * 2**20
    assert not any("embeddings" in name for name in stored)  # read from the installed MiniLM
    card = json.loads((SHIPPED_READER / "card.json").read_text())
    readme = (SHIPPED_READER / "README.md").read_text()
    reader = FiDReader.from_pretrained(SHIPPED_READER)
    assert card["architecture"]["parameters"] == sum(p.numel() for p in reader.parameters())
    assert card["architecture"]["parameters_shipped"] == sum(t.numel() for t in stored.values())
    assert f"{100 * card['demo_reading']['exact_match']:.1f}%" in readme
    for stage in card["training"]:
        assert f"{stage['steps']} steps of batch {stage['batch_size']}" in readme


@needs_mini
@pytest.mark.slow  # reads the demo's questions with the shipped reader
def test_the_shipped_reader_reads_the_demo_as_its_card_says():
    from atlas.demo.export_reader import demo_reading_em

    card = json.loads((SHIPPED_READER / "card.json").read_text())
    assert demo_reading_em(SHIPPED_READER) == pytest.approx(card["demo_reading"]["exact_match"], abs=1e-4)


@needs_mini
def test_quickstart_tiny_runs_end_to_end_and_the_edit_reaches_the_answerer(tmp_path, monkeypatch):
    from atlas.demo import quickstart

    out = tmp_path / "qs"

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C during the fine-tuning

    # a quickstart stopped at step 4 keeps steps 1-3: the same command resumes there
    monkeypatch.setattr(quickstart, "train_model", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_quickstart(out, tiny=True, progress=False, echo=lambda line: None)
    monkeypatch.undo()
    built = (out / "index" / "manifest.json").stat().st_mtime_ns
    lines: list[str] = []
    report = run_quickstart(out, tiny=True, progress=False, echo=lines.append)
    assert lines[0] == f"resuming the quickstart in {out}: prepare, index, eval_before done before"
    assert (out / "index" / "manifest.json").stat().st_mtime_ns == built  # not built again
    assert not any(line.startswith(("[1/6]", "[2/6]", "[3/6]")) for line in lines)
    for name in ("report.json", "report.md", "corpus/corpus.json", "index/manifest.json", "eval-before/metrics.json"):
        assert (out / name).is_file(), name
    assert json.loads((out / "report.json").read_text()) == report
    before, after = report["table"]
    assert before["answer_recall@1"] >= 75.0 and after["answer_recall@2"] >= 75.0  # MiniLM on the demo
    assert [len(a["evidence"]) for a in report["answers"]] == [2, 2, 2]
    edit = report["edit"]
    assert edit["done"] and 1 <= edit["edited"] <= 4 <= edit["eligible"], edit
    assert edit["edited"] == len(edit["facts"]) == len({f["id"] for f in edit["facts"]})
    for fact in edit["facts"]:
        assert states(fact["after"], fact["replacement"]) and not states(fact["after"], fact["gold"]), fact
        assert fact["kept"].startswith("relation ")  # the demo names each question's relation
    assert len({f["replacement"] for f in edit["facts"]}) == edit["edited"]  # never the same one twice
    assert edit["followed"] == sum(f["follows_edit"] for f in edit["facts"])
    interval = [100 * x for x in wilson_interval(edit["followed"], edit["edited"])]
    assert edit["follow_rate_interval"] == pytest.approx(interval, abs=0.05)
    assert any("95% interval" in line for line in lines)
    assert edit["edited_passage_read"] == edit["edited"]  # MiniLM finds every edited passage again
    assert any("follows the new text" in line or "did not follow" in line for line in lines)
    page = (out / "report.md").read_text()
    assert "## Corpus edits" in page and "```json" not in page and len(page) < 8000
    with pytest.raises(FileExistsError, match="holds a finished quickstart"):
        run_quickstart(out, tiny=True, progress=False, echo=lines.append)
    (out / "report.json").unlink()
    with pytest.raises(FileExistsError, match="started with other edits"):
        run_quickstart(out, tiny=True, n_edits=3, progress=False, echo=lines.append)


def _qa_lines(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@needs_mini
@pytest.mark.slow  # the fast tier runs the same pipeline on the shipped files (the tiny end-to-end test)
def test_quickstart_on_your_own_files_reports_the_dev_set_it_was_given(tmp_path):
    from atlas.cli import main

    heldout = _records("heldout.jsonl")
    (tmp_path / "train.jsonl").write_text(_qa_lines(_records("train.jsonl")[:24]))
    (tmp_path / "dev.jsonl").write_text(_qa_lines(heldout[:8]))
    out = tmp_path / "qs"
    assert (
        main(
            [
                "quickstart",
                "--docs",
                str(DEMO / "encyclopedia.jsonl"),
                "--train",
                str(tmp_path / "train.jsonl"),
                "--dev",
                str(tmp_path / "dev.jsonl"),
                "--shots",
                "12",
                "--tiny",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert report["dev"] == str(tmp_path / "dev.jsonl") and report["train"] == str(tmp_path / "train.jsonl")
    assert report["shots"] == 12 and report["dev_questions"] == 8 and report["split"] is None
    assert report["documents"] == [str(DEMO / "encyclopedia.jsonl")]
    assert f"dev questions: {tmp_path / 'dev.jsonl'} (8 evaluated)" in (out / "report.md").read_text()


def test_overlapping_train_and_dev_files_are_refused_naming_both(tmp_path, capsys):
    from atlas.cli import main

    train = _records("train.jsonl")[:5]
    (tmp_path / "train.jsonl").write_text(_qa_lines(train))
    (tmp_path / "dev.jsonl").write_text(_qa_lines([_records("heldout.jsonl")[0], train[3]]))
    code = main(
        [
            "quickstart",
            "--docs",
            str(DEMO / "encyclopedia.jsonl"),
            "--train",
            str(tmp_path / "train.jsonl"),
            "--dev",
            str(tmp_path / "dev.jsonl"),
            "--out",
            str(tmp_path / "qs"),
        ]
    )
    assert code != 0 and not (tmp_path / "qs").exists()
    message = capsys.readouterr().err
    assert (
        f"{tmp_path / 'dev.jsonl'}:2: field 'question': also in the training file {tmp_path / 'train.jsonl'} (line 4)"
        in message
    )


def test_one_questions_file_is_split_by_seed_and_the_split_is_said(tmp_path):
    records = [{"question": f"q{i}?", "answers": [f"a{i}"]} for i in range(10)]
    (tmp_path / "qa.jsonl").write_text(_qa_lines(records))
    data = split_questions(tmp_path / "qa.jsonl", tmp_path / "out", seed=0)
    train, dev = _records_at(data.train), _records_at(data.dev)
    assert data.split == {"from": str(tmp_path / "qa.jsonl"), "seed": 0, "train": 5, "dev": 5}
    assert sorted(r["question"] for r in train + dev) == sorted(r["question"] for r in records)
    assert not {r["question"] for r in train} & {r["question"] for r in dev}
    assert split_questions(tmp_path / "qa.jsonl", tmp_path / "again", seed=0).split == data.split
    assert _records_at(tmp_path / "again" / "questions" / "train.jsonl") == train


def _records_at(path) -> list[dict]:
    return [record for _, record in read_jsonl(path)]


def test_pretext_tasks_read_a_prepared_corpus_folder_with_its_passage_ids(tmp_path):
    """Pretext tasks (configs/pretrain-mini.yaml: `ssm`) train on the prepared corpus the index is built from."""
    from retriever.corpus import Corpus, prepare_corpus
    from tasks.base import get_task

    prepare_corpus([DEMO / "encyclopedia.jsonl"], tmp_path / "corpus", chunk_words=30, progress=False)
    corpus = Corpus.load(tmp_path / "corpus")
    examples = get_task("mlm").load(tmp_path / "corpus")
    usable = [p["id"] for p in corpus.rows(range(len(corpus))) if len(p["text"].split()) >= 2]  # min_words
    assert len(usable) < len(corpus)  # some 30-word chunkings leave a one-word tail
    assert [e.source_id for e in examples] == usable
    assert examples[0].metadata["passage"]["text"] == corpus[0]["text"]
    assert all("<extra_id_0>" in e.query for e in examples)


def _stage_run(folder, start) -> None:
    """A run folder as `atlas train` leaves it, reduced to what the card export reads: the latest
    checkpoint's config (reader.model = `start`)."""
    from atlas.config import load_config, save_config

    checkpoint = folder / "checkpoints" / "step-000010"
    (checkpoint / "reader").mkdir(parents=True)
    save_config(load_config(overrides=[f"reader.model={start}"]), checkpoint / "config.yaml")
    (folder / "checkpoints" / "latest").write_text("step-000010")


def test_a_stage_from_an_exported_reader_continues_its_card(tmp_path):
    from atlas.demo.export_reader import earlier_stages

    earlier = [{"steps": 700, "recipe": "configs/reader-stages/reader-squad.yaml"}, {"steps": 400, "recipe": "stage2"}]
    shipped = tmp_path / "shipped-reader"
    shipped.mkdir()
    (shipped / "card.json").write_text(json.dumps({"training": earlier}))
    _stage_run(tmp_path / "stage-from-shipped", shipped)
    _stage_run(tmp_path / "stage-from-scratch", "minilm-fid")
    assert earlier_stages(tmp_path / "stage-from-shipped") == earlier
    assert earlier_stages(tmp_path / "stage-from-scratch") == []
    # re-exporting the stage that made the shipped folder (its run named like its recipe) lists it once
    _stage_run(tmp_path / "reader-squad", shipped)
    assert earlier_stages(tmp_path / "reader-squad") == earlier[1:]


def test_the_card_names_every_encoder_block_any_stage_trained():
    from atlas.demo.export_reader import model_card

    stage = {
        "steps": 10,
        "batch_size": 2,
        "examples_seen": 20,
        "scheduled_steps": 10,
        "scheduler": "linear",
        "lr": 1e-4,
        "lr_encoder": 1e-5,
        "options": {"max_words": 100},
        "passages_read": 1,
        "text_maxlength": 192,
        "recipe": "r.yaml",
        "first_loss": 1.0,
        "final_loss": 0.5,
        "wall_s": 60,
        "hardware": "",
        "start": "x",
    }
    card = {
        "architecture": {
            "decoder_layers": 4,
            "d_model": 384,
            "num_heads": 6,
            "d_ff": 1536,
            "parameters": 10,
            "parameters_shipped": 5,
        },
        "continuation_beta": 1.0,
        "demo_reading": {"exact_match": 0.5},
        "training": [
            {**stage, "trainable_encoder_layers": 3},
            {**stage, "trainable_encoder_layers": 4},
            {**stage, "trainable_encoder_layers": 2},
        ],
    }
    assert "(the top 4 encoder blocks," in model_card(card)
    card["training"][1]["trainable_encoder_layers"] = None
    assert "(the whole encoder," in model_card(card)


def test_a_training_question_without_answers_is_refused_before_any_work(tmp_path, capsys):
    from atlas.cli import main

    train = tmp_path / "train.jsonl"
    train.write_text('{"question": "what is x?", "answers": ["y"]}\n{"question": "and z?"}\n')
    dev = tmp_path / "dev.jsonl"
    dev.write_text('{"question": "where is w?", "answers": ["v"]}\n')
    argv = ["quickstart", "--docs", str(DEMO / "encyclopedia.jsonl"), "--train", str(train), "--dev", str(dev)]
    assert main([*argv, "--out", str(tmp_path / "qs")]) == 2
    err = capsys.readouterr().err
    assert f"{train}:2: field 'answers'" in err and err.count("\n") == 1
    assert not (tmp_path / "qs" / "corpus").exists()  # nothing was done


def test_the_report_says_plainly_when_fine_tuning_lowered_a_score_and_gives_the_follow_rates_interval():
    before = {"model": "atlas-reader, no fine-tuning", "exact_match": 60.0, "f1": 70.0, "answer_recall@1": 80.0}
    after = {"model": "atlas-reader, 16-shot fine-tuned", "exact_match": 55.0, "f1": 71.0, "answer_recall@1": 80.0}
    edit = {"done": True, "eligible": 30, "edited": 25, "skipped": 0, "followed": 17, "follow_rate": 68.0}
    edit |= {"follow_rate_interval": [48.4, 82.8], "capped": True}
    text = summary_lines([before, after], edit)
    assert "Fine-tuning lowered exact_match (60.0 → 55.0):" in text and "f1 (" not in text
    assert "edited in the corpus (capped by --edits at 25)" in text and "(68%, 95% interval 48–83%)" in text
    # both follow figures, each said for what it is: the contained one first, then the exact one
    edit |= {"followed_exact": 15, "follow_rate_exact": 60.0, "follow_rate_exact_interval": [40.7, 76.6]}
    text = summary_lines([before, after], edit)
    assert "follow the new text (the new answer holds the replacement, not the old answer)" in text
    assert "15 (60%, 41–77%) exactly (the new answer is the replacement)" in text
    assert "lowered" not in summary_lines([before, before], edit)


@needs_mini
def test_the_recipes_own_commands_run_as_written(tmp_path, monkeypatch):
    """The "to run the recipe by hand" lines of atlas/demo/quickstart.yaml's header, from a folder where the
    repository's `atlas/` is at hand (the index they built was once refused as another encoder's)."""
    import shlex

    from atlas.cli import main

    lines = [line[1:].strip() for line in RECIPE.read_text().splitlines() if line.startswith("#   atlas ")]
    assert [shlex.split(line)[1] for line in lines] == ["corpus", "index", "train"]
    (tmp_path / "atlas").symlink_to(RECIPE.parents[1])
    monkeypatch.chdir(tmp_path)
    for line in lines:
        argv = shlex.split(line)[1:]
        if argv[0] == "train":  # as written, but one step: the training itself is the quickstart's own test
            argv += ["training.steps=1", "evaluation.max_examples=4"]
        assert main(argv) == 0, line
    assert (tmp_path / "runs" / "quickstart" / "train" / "checkpoints" / "latest").is_file()


def test_an_edit_changes_the_right_answer_the_reader_gave():
    """Of several right answers the fact edited is the reader's own (editing another one would leave its answer
    right and unchanged: the nq824 misses of 2026-11-27), compared as the metrics compare; else the first."""
    from atlas.demo.quickstart import answer_given
    from tasks.base import Example

    band = Example("1", "who are the traveling wilburys", None, ["Roy Orbison", "Bob Dylan", "G. Harrison"])
    assert answer_given(band, "bob dylan") == "Bob Dylan"
    assert answer_given(band, "Jeff Lynne") == "Roy Orbison"
    year = Example("2", "when did cybermen first appear in doctor who", None, ["in 1966", "1966"])
    assert answer_given(year, "1966.") == "1966"
