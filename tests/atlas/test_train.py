"""The training recipe end to end on tiny models: loss goes down, resume is exact,
accumulation divides, the retriever loss never reaches the reader, and the CLI chain works."""

from __future__ import annotations

import json
import math

import pytest
import torch

from atlas.cli import main
from atlas.config import load_config, save_config
from atlas.loading import load_model, recipe_spec
from atlas.training.loop import lr_multiplier, train
from tasks.base import get_task


def tiny_config(world, out, *overrides):
    return load_config(
        None,
        [
            f"retriever.model={world['encoder']}",
            "retriever.loss=pdist",
            "retriever.n_context=3",
            "retriever.temperature_gold=0.1",
            "retriever.temperature_score=0.1",
            f"index.path={world['index']}",
            "reader.model=t5-tiny",
            "reader.n_context=3",
            "reader.text_maxlength=48",
            "reader.dropout=0.0",
            "reader.answer_maxlength=8",
            "inference.generation_max_length=6",
            "task.name=qa",
            f"task.train_data=[{world['qa']}]",
            f"task.eval_data=[{world['qa']}]",
            f"training.output_dir={out}",
            "training.steps=8",
            "training.batch_size=2",
            "training.lr=3e-3",
            "training.lr_retriever=1e-3",
            "training.warmup_steps=1",
            "training.log_every=1",
            "evaluation.retrieval_k=[1,3]",
            "task.allow_overlap=true",  # a pipeline check: it evaluates on the questions it trains on
            *overrides,
        ],
    )


def logged_losses(out):
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss/total"] for r in lines if "loss/total" in r}


def test_training_lowers_the_loss_and_writes_a_loadable_checkpoint(tiny_world, tmp_path):
    from transformers import AutoModel, T5ForConditionalGeneration

    summary = train(tiny_config(tiny_world, tmp_path / "run"), progress=False)
    losses = summary["losses"]
    assert len(losses) == 8
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000008"
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000008"
    # plain Hugging Face loaders read the saved components
    T5ForConditionalGeneration.from_pretrained(checkpoint / "reader")
    AutoModel.from_pretrained(checkpoint / "retriever" / "query")
    assert (tmp_path / "run" / "config.yaml").exists() and (checkpoint / "config.yaml").exists()
    assert set(summary["eval"]) >= {"exact_match", "f1", "answer_recall@1", "answer_recall@3"}
    # percent, as computed by hand from the written predictions, in the summary and in the log
    from tasks.metrics import normalize_answer

    rows = [
        json.loads(line)
        for line in (tmp_path / "run" / "eval-step-000008" / "predictions.jsonl").read_text().splitlines()
    ]
    right = sum(any(normalize_answer(r["prediction"]) == normalize_answer(a) for a in r["answers"]) for r in rows)
    assert summary["eval"]["exact_match"] == 100 * (right / len(rows))
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["eval/exact_match"] for r in logged if "eval/exact_match" in r] == [summary["eval"]["exact_match"]]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["eval"] == summary["eval"]


def test_resume_continues_bit_identically(tiny_world, tmp_path):
    straight = tiny_config(tiny_world, tmp_path / "straight", "training.steps=6", "training.save_every=3")
    train(straight, progress=False)
    halted = tiny_config(tiny_world, tmp_path / "halted", "training.steps=6")
    train(halted, progress=False, stop_at=3)
    assert not (tmp_path / "halted" / "summary.json").read_text().count('"exact_match"')
    train(None, resume=tmp_path / "halted", progress=False)
    a, b = logged_losses(tmp_path / "straight"), logged_losses(tmp_path / "halted")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]  # bit-identical


def test_resume_with_dropout_restores_the_random_state(tiny_world, tmp_path, monkeypatch):
    """Reader dropout 0.1: steps 4–6 draw their dropout masks from the RNG state stored in the
    step-3 checkpoint, so 3 + resume + 3 equals 6 straight bit for bit; without the restore
    (patched out) the resumed losses differ, so the test does exercise it."""
    dropout = ("reader.dropout=0.1", "training.steps=6")
    train(tiny_config(tiny_world, tmp_path / "straight", *dropout, "training.save_every=3"), progress=False)
    train(tiny_config(tiny_world, tmp_path / "halted", *dropout), progress=False, stop_at=3)
    train(None, resume=tmp_path / "halted", progress=False)
    a, b = logged_losses(tmp_path / "straight"), logged_losses(tmp_path / "halted")
    assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]  # bit-identical

    train(tiny_config(tiny_world, tmp_path / "no-restore", *dropout), progress=False, stop_at=3)
    monkeypatch.setattr("atlas.training.loop.set_rng_state", lambda state: None)
    train(None, resume=tmp_path / "no-restore", progress=False)
    c = logged_losses(tmp_path / "no-restore")
    assert [c[s] for s in range(1, 4)] == [a[s] for s in range(1, 4)]
    assert all(abs(c[s] - a[s]) > 1e-6 for s in range(4, 7))


def test_bf16_precision_autocasts_the_forward_pass(tiny_world, tmp_path):
    """training.precision=bf16 autocasts on the model's device (here the CPU): the losses move
    by bf16 rounding (fp32 repeats exactly)."""
    fp32 = train(tiny_config(tiny_world, tmp_path / "fp32", "training.steps=3"), progress=False)["losses"]
    bf16 = train(
        tiny_config(tiny_world, tmp_path / "bf16", "training.steps=3", "training.precision=bf16"), progress=False
    )["losses"]
    relative = [abs(b - a) / a for a, b in zip(fp32, bf16)]
    # bf16 moves the losses (at some step by more than fp32 noise), but only by rounding; a single
    # step may land within 1e-5 by chance (measured: 1.1e-4, 9.7e-6, 2.1e-3)
    assert max(relative) > 1e-4 and all(r < 1e-2 for r in relative), relative


def test_resume_restores_both_optimizers_and_schedulers(tiny_world, tmp_path):
    from atlas.training.checkpoint import load_training_state

    train(tiny_config(tiny_world, tmp_path / "run", "training.steps=2"), progress=False)
    state = load_training_state(tmp_path / "run" / "checkpoints" / "step-000002")
    assert state["step"] == 2 and state["retriever_optimizer"]["state"]
    assert len(state["schedulers"]) == 2 and all(s["last_epoch"] == 2 for s in state["schedulers"])
    assert state["data_position"] == {"epoch": 0, "offset": 4}  # 4 examples: 2 steps of 2


def test_gradient_accumulation_divides_the_loss(tiny_world, tmp_path):
    """One step of batch 2 equals two accumulated micro-batches of 1 (equal-length targets)."""

    def one_step(*overrides):
        config = tiny_config(
            tiny_world,
            tmp_path / "acc",
            "training.steps=1",
            "training.clip_norm=1e9",
            "retriever.loss=none",
            *overrides,
        )
        torch.manual_seed(0)
        model = load_model(recipe_spec(config))
        task = get_task("qa")
        examples = task.load(tiny_world["qa"])[:2]
        targets = ["<extra_id_0> alpha beta", "<extra_id_0> gamma delta"]
        steps = config.training.accumulation_steps
        size = config.training.batch_size
        for i in range(steps):
            loss = model.losses(examples[i * size : (i + 1) * size], targets[i * size : (i + 1) * size])["total"]
            (loss / steps).backward()
        return torch.cat([p.grad.flatten() for p in model.reader.parameters() if p.grad is not None])

    full = one_step("training.batch_size=2", "training.accumulation_steps=1")
    accumulated = one_step("training.batch_size=1", "training.accumulation_steps=2")
    torch.testing.assert_close(accumulated, full, rtol=1e-5, atol=1e-7)


def test_retriever_loss_sends_no_gradient_into_the_reader(tiny_world, tmp_path):
    config = tiny_config(tiny_world, tmp_path / "g", "retriever.loss=adist")
    model = load_model(recipe_spec(config))
    model.train()
    examples = get_task("qa").load(tiny_world["qa"])[:2]
    losses = model.losses(examples, ["<extra_id_0> Quimper", "<extra_id_0> Belmont"])
    losses["retriever"].backward()
    assert all(p.grad is None or not p.grad.any() for p in model.reader.parameters())
    query_grads = [p.grad for p in model.retriever.query_encoder.parameters() if p.grad is not None]
    assert query_grads and any(g.abs().sum() > 0 for g in query_grads)
    assert all(p.grad is None for p in model.retriever.passage_encoder.parameters())  # frozen, untied


def test_closed_book_and_given_passages(tiny_world, tmp_path):
    from tasks.base import Example
    from tasks.passage import Passage

    model = load_model(recipe_spec(tiny_config(tiny_world, tmp_path / "cb", "task.closed_book=true")))
    assert model.retriever is None and model.passages_for([], 3) is None
    ids, _ = model.reader_inputs(["question: x answer: <extra_id_0>"], None)
    assert ids.shape[:2] == (1, 1)
    model = load_model(recipe_spec(tiny_config(tiny_world, tmp_path / "gp")))
    given = [{"id": "g1", "title": "T", "text": "given text"}, {"id": "g2", "title": "U", "text": "more"}]
    example = Example(id="e", query="q", target=None, answers=[], passages=given)
    assert model.passages_for([example], 1) == [[Passage(id="g1", title="T", text="given text")]]


def test_trivial_retrievals_are_filtered(tiny_world, tmp_path):
    from tasks.base import Example

    model = load_model(recipe_spec(tiny_config(tiny_world, tmp_path / "f")))
    plain = Example(id="e", query="Zorbland capital Quimper", target=None, answers=[])
    own = model.retrieve([plain], 5)[0]
    top = own[0].id
    filtered = model.retrieve([Example(id="e", query=plain.query, target=None, answers=[], source_id=top)], 3)[0]
    assert top not in [p.id for p in filtered] and len(filtered) == 3
    assert [p.id for p in filtered] == [p.id for p in own if p.id != top][:3]


def test_retriever_scores_match_index_inner_products(tiny_world, tmp_path):
    model = load_model(recipe_spec(tiny_config(tiny_world, tmp_path / "s")))
    model.eval()
    from tasks.base import Example

    example = Example(id="e", query="who climbed mount olo", target=None, answers=[])
    passages = model.retrieve([example], 3)
    with torch.no_grad():
        scores = model.retriever_scores([example.query], passages)
    expected = torch.tensor([[p.score for p in passages[0]]])
    torch.testing.assert_close(scores, expected, rtol=1e-3, atol=1e-3)  # index stores float16


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("linear", [0.5, 1.0, 1.0, 0.5, 0.0]),
        ("cosine", [0.5, 1.0, 1.0, 0.5, 0.0]),
        ("constant", [0.5, 1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_learning_rate_schedules(kind, expected):
    got = [lr_multiplier(s, warmup=2, total=6, kind=kind) for s in [0, 1, 2, 4, 6]]
    assert got == pytest.approx(expected)


def test_cli_train_evaluate_ask(tiny_world, tmp_path, capsys):
    out = tmp_path / "cli"
    recipe = tmp_path / "recipe.yaml"
    from atlas.config import save_config

    save_config(tiny_config(tiny_world, out, "training.steps=3"), recipe)
    assert main(["train", str(recipe), "training.steps=2"]) == 0
    assert json.loads((out / "summary.json").read_text())["step"] == 2
    assert main(["evaluate", str(out), "--data", str(tiny_world["qa"]), "--out", str(tmp_path / "ev")]) == 0
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "ev" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and len(rows[0]["passages"]) == 3 and {"exact_match", "answer_recall@3"} <= set(metrics)
    capsys.readouterr()
    assert main(["ask", str(out), "who first climbed mount olo", "--show", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Q: who first climbed mount olo\nA: ") and "[2]" in printed
    assert main(["ask", str(out), "  "]) == 2  # bad input: one line, exit code 2
    assert capsys.readouterr().err == "atlas ask: error: the question is empty or not text: '  '\n"


def test_cli_train_says_what_the_run_folder_holds_on_disk(tiny_world, tmp_path, capsys):
    from atlas.config import save_config
    from atlas.training.checkpoint import folder_bytes, megabytes

    out = tmp_path / "disk"
    recipe = tmp_path / "recipe.yaml"
    save_config(
        tiny_config(tiny_world, out, "training.steps=2", "training.save_every=1", "training.keep_last=1"), recipe
    )
    assert main(["train", str(recipe)]) == 0
    printed = capsys.readouterr().out
    checkpoint = out / "checkpoints" / "step-000002"
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == ["step-000002"]  # keep_last=1
    total, state = folder_bytes(checkpoint), (checkpoint / "training_state.pt").stat().st_size
    disk = json.loads((out / "summary.json").read_text())["disk"]
    assert disk["checkpoint_bytes"] == total and disk["training_state_bytes"] == state
    assert disk["weights_bytes"] == total - state and disk["checkpoints_kept"] == 1 and disk["keep_last"] == 1
    # AdamW's two moments per trained weight (reader and query encoder): the state outweighs the reader
    assert state > folder_bytes(checkpoint / "reader")
    assert printed.endswith(
        f"wrote {checkpoint} ({megabytes(total)}, of which training_state.pt {megabytes(state)}: the optimizer state, "
        f"read only by --resume; delete it once the run is final). training.keep_last=1 keeps the newest 1: "
        f"1 checkpoint(s) now; {out} holds {megabytes(disk['run_folder_bytes'])} in all\n"
    )
    assert disk["run_folder_bytes"] >= total


def test_zero_training_steps_evaluate_and_write_no_checkpoint(tiny_world, tmp_path, capsys):
    from atlas.config import save_config

    out = tmp_path / "zero"
    recipe = tmp_path / "recipe.yaml"
    save_config(tiny_config(tiny_world, out, "training.steps=0"), recipe)
    assert main(["train", str(recipe)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint"] is None and summary["losses"] == [] and "disk" not in summary
    assert not (out / "checkpoints").exists()
    assert not [p for p in out.rglob("*") if p.suffix in (".safetensors", ".pt", ".bin")]
    metrics = json.loads((out / "eval-step-000000" / "metrics.json").read_text())
    assert {k: v for k, v in summary["eval"].items() if not k.startswith("train_recall/")} == metrics
    assert 0.0 <= metrics["answer_recall@3"] <= 100.0
    assert (
        "training.steps is 0: the model was evaluated as built; nothing was trained, so no checkpoint was "
        "written" in printed
    )


def test_an_evaluation_file_without_answers_fails_before_training(tiny_world, tmp_path):
    from common.io import InputError

    dev = tmp_path / "dev.jsonl"
    dev.write_text(
        '{"question": "what is the capital of zorbland", "answers": ["Quimper"]}\n'
        '{"question": "who first climbed mount olo", "answer_text": "Anna Brook"}\n'
    )
    config = tiny_config(tiny_world, tmp_path / "run", f"task.eval_data=[{dev}]")
    with pytest.raises(
        InputError,
        match=rf"^{dev}:2: field 'answers': no gold answer to score against \(1 of 2 "
        r"examples have none\)",
    ):
        train(config, progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "log.jsonl").exists()


def test_a_resumed_run_logs_exactly_what_an_uninterrupted_one_does(tiny_world, tmp_path):
    straight = tiny_config(tiny_world, tmp_path / "straight", "training.steps=6", "retriever.loss=none")
    train(straight, progress=False)
    killed = tiny_config(
        tiny_world, tmp_path / "killed", "training.steps=6", "retriever.loss=none", "training.save_every=4"
    )
    train(killed, progress=False, stop_at=6)  # as if killed after step 6: the last checkpoint is step 4
    (tmp_path / "killed" / "checkpoints" / "latest").write_text("step-000004\n")
    with open(tmp_path / "killed" / "log.jsonl", "ab") as log:  # and a power cut: the unsynced tail reads as zeros
        log.write(b'{"step": 7, "loss/rea' + bytes(300))
    train(None, resume=tmp_path / "killed", progress=False)

    def steps(run):
        return [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()]

    assert steps(tmp_path / "killed") == steps(tmp_path / "straight")
    assert logged_losses(tmp_path / "killed") == logged_losses(tmp_path / "straight")


def test_a_log_cut_short_by_a_crash_reads_back_its_whole_lines_and_names_the_others(tmp_path, caplog):
    from atlas.training.run_log import read_log

    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"step": 1, "loss": 0.5}\n\n{"step": 2, "loss": 0.25}\n{"step": 3, "lo' + bytes(40))
    assert read_log(log) == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]
    assert f"{log} line 4: not a JSON record" in caplog.text
    caplog.clear()
    log.write_bytes(bytes(4096))  # never fsync'd at all: zeros to its size
    assert read_log(log) == []
    assert f"{log} line 1: not a JSON record" in caplog.text


def test_refresh_schedule_parsing():
    from atlas.training.refresh import parse_refresh_schedule, refresh_due

    schedule = parse_refresh_schedule("0-1000:500,1000-10000:2000")
    due = [s for s in range(1, 10001) if refresh_due(s, schedule)]
    assert due == [500, 1000, 3000, 5000, 7000, 9000]
    assert parse_refresh_schedule("never") == []
    with pytest.raises(ValueError, match="bad range '10:5'; expected START-END:EVERY"):
        parse_refresh_schedule("10:5")
    with pytest.raises(ValueError, match="needs START < END"):
        parse_refresh_schedule("5-5:1")


def test_full_retriever_training_refreshes_the_index(tiny_world, tmp_path):
    """Tied encoders train the passage side: the index is re-embedded on schedule."""
    import numpy as np

    from retriever.index import PassageIndex

    out = tmp_path / "tied"
    config = tiny_config(
        tiny_world,
        out,
        "retriever.tied=true",
        "training.steps=2",
        "index.refresh=0-2:1",
        "index.reencode_candidates=5",
        "training.lr_retriever=1e-2",
    )
    train(config, progress=False)
    refreshed = PassageIndex.load(out / "index-refreshed")
    original = PassageIndex.load(tiny_world["index"])
    assert refreshed.manifest.encoder_fingerprint != original.manifest.encoder_fingerprint
    assert not np.array_equal(np.asarray(refreshed.vectors), np.asarray(original.vectors))
    logged = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "index_refreshed" in r] == [1, 2]


def test_dispersion_auxiliary_loss(tiny_world, tmp_path):
    """total = CE − μ·dispersion, dispersion = mean pairwise cosine distance of final decoder
    states over target tokens, checked against a brute-force pairwise loop."""
    model = load_model(
        recipe_spec(tiny_config(tiny_world, tmp_path / "d", "reader.dispersion_weight=0.5", "retriever.loss=none"))
    )
    model.eval()
    examples = get_task("qa").load(tiny_world["qa"])[:2]
    targets = ["<extra_id_0> Quimper", "<extra_id_0> Anna Brook"]
    losses = model.losses(examples, targets)
    labels = model.target_labels(targets)
    passages = model.passages_for(examples, 3)
    ids, mask = model.reader_inputs([e.query for e in examples], passages)
    out = model.reader(ids, mask, labels=labels, output_hidden_states=True)
    hidden = out.decoder_hidden_states[-1].double()
    vectors = hidden[labels != -100]
    pairs = [(i, j) for i in range(len(vectors)) for j in range(len(vectors)) if i != j]
    brute = sum(1 - torch.nn.functional.cosine_similarity(vectors[i], vectors[j], dim=0) for i, j in pairs) / len(pairs)
    assert losses["dispersion"].item() == pytest.approx(brute.item(), rel=1e-5)
    assert losses["total"].item() == pytest.approx(out.loss.item() - 0.5 * brute.item(), rel=1e-5)


def test_a_training_example_without_answers_stops_the_run_at_start_or_is_skipped(tiny_world, tmp_path, caplog):
    data = tmp_path / "qa.jsonl"
    lines = tiny_world["qa"].read_text().splitlines()
    data.write_text("\n".join([lines[0], '{"question": "no answers field"}', *lines[1:]]) + "\n")
    overrides = [f"task.train_data=[{data}]", "training.steps=2"]
    from common.io import InputError

    with pytest.raises(InputError, match=r"qa\.jsonl:2: field 'answers': example '1' has no answers"):
        train(tiny_config(tiny_world, tmp_path / "strict", *overrides))
    assert not (tmp_path / "strict" / "log.jsonl").exists()  # stopped before the first step
    train(tiny_config(tiny_world, tmp_path / "lenient", *overrides, "task.skip_invalid=true"))
    assert sorted(logged_losses(tmp_path / "lenient")) == [1, 2]
    assert "1 example(s) without a training target skipped" in caplog.text


def _logged(run, key):
    return {r["step"]: r[key] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if key in r}


def test_the_training_log_guards_the_retrievers_answer_recall(tiny_world, tmp_path, caplog):
    """With a retriever loss, answer recall@k of the retriever on the training questions is logged at
    step 0 (the figure of the untrained retriever, computed here by hand from its retrievals) and at
    every evaluation; a resumed run compares with the logged step-0 figure and warns when recall fell."""
    from tasks.metrics import has_answer

    overrides = ("reader.n_context=1", "training.steps=4", "training.save_every=2", "training.eval_every=2")
    config = tiny_config(tiny_world, tmp_path / "run", *overrides)
    examples = get_task("qa").load(tiny_world["qa"])
    untrained = load_model(recipe_spec(config)).eval()
    retrieved = untrained.retrieve(examples, 3)
    by_hand = {
        k: 100
        * sum(any(has_answer(e.answers, f"{p.title} {p.text}") for p in ps[:k]) for e, ps in zip(examples, retrieved))
        / len(examples)
        for k in (1, 3)
    }

    train(config, progress=False, stop_at=2)
    at_1, at_3 = (
        _logged(tmp_path / "run", "train_recall/answer_recall@1"),
        _logged(tmp_path / "run", "train_recall/answer_recall@3"),
    )
    assert at_1[0] == pytest.approx(by_hand[1]) and at_3[0] == pytest.approx(by_hand[3])
    assert sorted(at_1) == [0, 2]  # start, and the evaluation at step 2

    # the step-0 figure is the baseline a resumed run keeps: raise it, and the final check must warn
    log = tmp_path / "run" / "log.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    lines = [
        {**r, "train_recall/answer_recall@1": 100.0, "train_recall/answer_recall@3": 100.0} if r["step"] == 0 else r
        for r in lines
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    caplog.clear()
    summary = train(None, resume=tmp_path / "run", progress=False)
    final = _logged(tmp_path / "run", "train_recall/answer_recall@1")
    assert sorted(final) == [0, 2, 4] and final[0] == 100.0
    assert summary["train_recall_before"] == {"answer_recall@1": 100.0, "answer_recall@3": 100.0}
    assert summary["eval"]["train_recall/answer_recall@1"] == final[4]
    assert final[4] < 99  # the tiny random encoder does not find every answer first
    assert (
        "the retriever loss 'pdist' lowered answer recall on 4 training questions (answer_recall@1 100.0 →"
        in caplog.text
    )


def test_no_recall_guard_without_a_retriever_loss(tiny_world, tmp_path):
    train(tiny_config(tiny_world, tmp_path / "run", "retriever.loss=none", "training.steps=2"), progress=False)
    assert not _logged(tmp_path / "run", "train_recall/answer_recall@3")
    with pytest.raises(Exception, match="train_recall_examples' must be at least 0"):
        tiny_config(tiny_world, tmp_path / "bad", "evaluation.train_recall_examples=-1")


def test_a_retrieval_prior_needs_a_copy_head_and_a_non_negative_weight(tiny_world, tmp_path):
    with pytest.raises(Exception, match="'inference.retrieval_prior' must be at least 0"):
        tiny_config(tiny_world, tmp_path / "bad", "inference.retrieval_prior=-1")
    with pytest.raises(
        ValueError, match="inference.retrieval_prior weights a copy head's pointer; this reader has no copy head"
    ):
        load_model(recipe_spec(tiny_config(tiny_world, tmp_path / "run", "inference.retrieval_prior=1.0")))


def test_a_loss_that_is_not_finite_stops_the_run_before_it_reaches_the_weights(tiny_world, tmp_path):
    """A learning rate of 1e30 sends the weights to infinity at the first step with a non-zero
    rate; the next step's loss is then not finite, and the run stops there, naming the step, before
    any optimizer step spreads it: the log and the checkpoints end at the step before."""
    import re

    from atlas.training.loop import NonFiniteLoss

    config = tiny_config(
        tiny_world,
        tmp_path / "run",
        "training.steps=6",
        "training.lr=1e30",
        "training.lr_retriever=1e30",
        "training.save_every=1",
    )
    with pytest.raises(NonFiniteLoss, match=r"training step \d: the loss is not finite \(reader nan") as raised:
        train(config, progress=False)
    assert "training.precision=bf16 on CUDA" in str(raised.value)
    stopped = int(re.search(r"training step (\d)", str(raised.value)).group(1))
    assert 1 < stopped < 6
    logged = logged_losses(tmp_path / "run")
    assert sorted(logged) == list(range(1, stopped)) and all(math.isfinite(v) for v in logged.values())
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == f"step-{stopped - 1:06d}"


def test_a_run_folder_is_never_silently_replaced(tiny_world, tmp_path, capsys):
    """A second run into a folder that holds another run (here: fewer steps) is refused with the differences
    named, the first run's checkpoints intact; the same config continues the run; --overwrite replaces it."""
    out = tmp_path / "run"
    train(tiny_config(tiny_world, out, "training.steps=3", "task.eval_data=[]"), progress=False)
    latest = out / "checkpoints" / "latest"
    with pytest.raises(FileExistsError, match=r"holds another training run .*training\.steps: 3 → 1.*--overwrite"):
        train(tiny_config(tiny_world, out, "training.steps=1", "task.eval_data=[]"), progress=False)
    assert latest.read_text().strip() == "step-000003" and (out / "checkpoints" / "step-000003" / "reader").is_dir()
    recipe = f"{tmp_path / 'recipe.yaml'}"
    save_config(tiny_config(tiny_world, out, "training.steps=1", "task.eval_data=[]"), recipe)
    assert main(["train", recipe]) == 2
    assert "holds another training run" in capsys.readouterr().err.splitlines()[-1]
    again = train(tiny_config(tiny_world, out, "training.steps=3", "task.eval_data=[]"), progress=False)
    assert again["step"] == 3 and latest.read_text().strip() == "step-000003"  # the same run, continued
    assert main(["train", recipe, "--overwrite"]) == 0
    assert latest.read_text().strip() == "step-000001"
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000001"]
