"""`atlas train|evaluate|ask`: the jobs that run the whole model.

`evaluate`, `ask` (and `serve`) load their model as the Python API does (`atlas.loading`): a run folder, a
checkpoint folder, or a reader to run without training (a reader folder, the shipped reader's name
`atlas-reader`, a reader preset or a Hub id) with `--index`. A reader runs with the index's own encoder as
retriever and the settings its folder carries (`atlas.yaml`: passages read, decoding).
"""

# Lazy imports: the handlers import the model, training and evaluation modules (torch, transformers, faiss)
# when they run, so that `atlas --help` and argument errors answer at once.

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

MODEL_HELP = (
    "a run folder, a checkpoint folder, or a reader to run without training: a reader folder, "
    "'atlas-reader' (the shipped reader), a reader preset or a Hub id (then --index is required)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the model-running commands to the `atlas` parser."""
    # long: the parsers of the model-running commands, declared in one place as argparse reads best: each block is
    # its command's arguments
    train = subparsers.add_parser(
        "train",
        help="train reader + retriever from a YAML recipe",
        description="Train reader + retriever from a YAML recipe (docs/guides/recipes.md lists them). The index: "
        "index.path (an index folder) wins over index.corpus; with only index.corpus, the index is "
        "built once per corpus, encoder and index settings, cached beside the corpus "
        "(CORPUS/.atlas-index-cache/) and reused by later runs (docs/guides/corpus.md).",
    )
    train.add_argument("config", nargs="?", help="a YAML recipe from configs/ (omit with --resume)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.lr=4e-5")
    train.add_argument("--resume", metavar="DIR", help="continue the run in DIR (its latest checkpoint)")
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in training.output_dir (default: the same config continues it, another "
        "config is refused with its differences)",
    )
    train.add_argument(
        "--stop-at",
        type=int,
        metavar="STEP",
        help="end this session after STEP with a checkpoint (e.g. a job's time slot); "
        "--resume continues to training.steps",
    )
    train.set_defaults(func=_train)

    evaluate = subparsers.add_parser(
        "evaluate",
        help="generate on a data file and score it with the task's metrics (percent)",
        description="Predict on --data and score with the task's metrics, in percent. Writes predictions.jsonl, "
        "metrics.json and config.yaml (KILT: also kilt_predictions.jsonl, kilt_scores.json) to --out; "
        "never a checkpoint. docs/guides/evaluate.md explains every metric.",
    )
    evaluate.add_argument("checkpoint", metavar="MODEL", help=MODEL_HELP)
    evaluate.add_argument("--data", required=True, help="examples to evaluate on (every one with gold answers)")
    evaluate.add_argument("--index", help="index folder to retrieve from (default: the run's; required for a reader)")
    evaluate.add_argument("--task", help="task name (default: the run's; qa for a reader)")
    evaluate.add_argument(
        "--out",
        help="output folder (default: CHECKPOINT/eval-<data name>; for a reader runs/eval-<reader name>-<data name>)",
    )
    evaluate.add_argument(
        "--predict-only", action="store_true", help="an unlabelled test set: write the predictions, score nothing"
    )
    evaluate.add_argument("overrides", nargs="*", help="dotted overrides, e.g. evaluation.max_examples=100")
    evaluate.set_defaults(func=_evaluate)

    per_subject = subparsers.add_parser(
        "mmlu-per-subject",
        help="MMLU 5-shot per subject: fine-tune one model per subject on its dev split, evaluate it on "
        "its test split, merge all subjects into one per-category/overall table",
    )
    per_subject.add_argument("config", help="the per-subject recipe, e.g. configs/mmlu-5shot.yaml")
    per_subject.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.steps=16")
    per_subject.add_argument("--data-dir", required=True, help="the MMLU root (with dev/ and test/ folders)")
    per_subject.add_argument("--subjects", help="comma-separated subjects (default: all that have dev and test)")
    per_subject.add_argument("--out", help="output folder (default: the recipe's training.output_dir)")
    per_subject.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each subject's checkpoint (default: deleted once it is evaluated)",
    )
    per_subject.set_defaults(func=_mmlu_per_subject)

    score = subparsers.add_parser("score", help="score a predictions file against gold with the task's metrics")
    score.add_argument("--task", required=True, help="qa, kilt, mmlu, fever")
    score.add_argument("--gold", required=True, help="gold examples (the task's own format; KILT jsonl for kilt)")
    score.add_argument(
        "--pred",
        required=True,
        help="predictions: {id|question, answer} lines, KILT's format for kilt, or the "
        "predictions.jsonl of `atlas evaluate` (MMLU: with its probabilities)",
    )
    score.add_argument(
        "--official", action="store_true", help="kilt: print KILT's official report instead (its key names, scale 0-1)"
    )
    score.set_defaults(func=_score)

    ask = subparsers.add_parser("ask", help="answer one question and show the evidence passages")
    ask.add_argument("checkpoint", metavar="MODEL", help=MODEL_HELP)
    ask.add_argument("question")
    ask.add_argument("--index", help="index folder to retrieve from (default: the run's; required for a reader)")
    ask.add_argument("--show", type=int, default=3, help="evidence passages to print")
    ask.set_defaults(func=_ask)


def _train(args: argparse.Namespace) -> int:
    from atlas.config import load_config
    from atlas.training.loop import train

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.resume:
        if args.config or args.overrides:
            raise SystemExit("atlas train --resume DIR takes no config: the run's own config is used")
        summary = train(None, resume=args.resume, stop_at=args.stop_at)
    else:
        if not args.config:
            raise SystemExit("atlas train: give a config (e.g. configs/small/nq-64shot.yaml) or --resume DIR")
        summary = train(load_config(args.config, args.overrides), stop_at=args.stop_at, overwrite=args.overwrite)
    print(
        json.dumps(
            {
                "step": summary["step"],
                "final_loss": summary["losses"][-1] if summary["losses"] else None,
                "eval": summary["eval"],
                "checkpoint": summary["checkpoint"],
            },
            indent=2,
        )
    )
    if summary.get("disk"):
        print(summary["disk"]["message"])
    elif summary["checkpoint"] is None:
        print(
            "training.steps is 0: the model was evaluated as built; nothing was trained, so no checkpoint was "
            "written (`atlas evaluate READER --index IDX --data FILE` evaluates a reader without a recipe)"
        )
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    """`atlas evaluate`: under torchrun every rank predicts its share of the examples (a sharded
    index is searched by all ranks in lockstep) and rank 0 writes the outputs and the metrics."""
    from atlas.distributed import init_distributed, shutdown
    from atlas.evaluate import evaluate
    from atlas.loading import load_model, model_spec
    from tasks.base import get_task

    context = init_distributed()  # before the model: a sharded index needs the process group
    try:
        spec = model_spec(args.checkpoint, index=args.index, task=args.task, overrides=args.overrides)
        if spec.index is None and not spec.config.task.closed_book:
            raise ValueError(
                f"{args.checkpoint} is a reader, not a run: it has no index of its own; give --index IDX "
                "(an index folder made by `atlas index build`)"
            )
        model = load_model(spec, context=context)
        config = spec.config
        task = get_task(config.task.name, **config.task.options)
        folder = Path(spec.source.path)
        if args.out:
            out = Path(args.out)
        elif spec.source.kind != "checkpoint":  # never inside a reader folder (the shipped one is in the package)
            out = Path("runs") / f"eval-{folder.name}-{Path(args.data).stem}"
        else:
            out = folder / f"eval-{Path(args.data).stem}"
        # the config as evaluated: the model's, with this command's task, data and overrides
        recorded = dataclasses.replace(config, task=dataclasses.replace(config.task, eval_data=[str(args.data)]))
        metrics = evaluate(
            model,
            task,
            args.data,
            config.evaluation,
            out_dir=out if context.is_main else None,
            run_config=recorded,
            context=context,
            predict_only=args.predict_only,
        )
        if context.is_main:
            if not args.predict_only:
                print(json.dumps(metrics, indent=2))
                print(f"metrics in percent (docs/guides/evaluate.md); predictions and metrics written to {out}")
            elif config.evaluation.write_predictions:
                print(
                    f"{args.data}: predicted, not scored (--predict-only); predictions written to {out} "
                    "(score them later with `atlas score`)"
                )
            else:
                print(
                    f"{args.data}: predicted, not scored (--predict-only), and evaluation.write_predictions is "
                    "false: nothing was written"
                )
    finally:
        shutdown(context)
    return 0


def _mmlu_per_subject(args: argparse.Namespace) -> int:
    """`atlas mmlu-per-subject`: see `atlas.training.mmlu_per_subject` (one model per subject, one table)."""
    from atlas.config import load_config
    from atlas.distributed import init_distributed, shutdown
    from atlas.training.mmlu_per_subject import run_per_subject

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = load_config(args.config, args.overrides)
    subjects = [s.strip() for s in args.subjects.split(",") if s.strip()] if args.subjects else None
    context = init_distributed()
    try:
        metrics = run_per_subject(
            config,
            args.data_dir,
            out_dir=args.out,
            subjects=subjects,
            keep_checkpoints=args.keep_checkpoints,
            context=context,
        )
        if context.is_main:
            table = {k: v for k, v in metrics.items() if "/subject/" not in k}
            print(json.dumps(table, indent=2))
            out = args.out or config.training.output_dir
            print(f"per-subject runs, merged predictions and metrics written to {out}")
    finally:
        shutdown(context)
    return 0


def _score(args: argparse.Namespace) -> int:
    from tasks.score import score_files

    print(json.dumps(score_files(args.task, args.gold, args.pred, official=args.official), indent=2))
    return 0


def _ask(args: argparse.Namespace) -> int:
    from atlas.api import Atlas
    from atlas.loading import resolve_source
    from common.limits import check_question

    check_question(args.question)  # before minutes of loading
    if resolve_source(args.checkpoint).kind != "checkpoint" and not args.index:
        raise ValueError(
            f"{args.checkpoint} is a reader, not a run: it has no index of its own; give --index IDX "
            "(an index folder made by `atlas index build`)"
        )
    model = Atlas.from_pretrained(args.checkpoint, index=args.index, verbose=args.verbose)
    answer = model.answer(args.question)
    print(f"Q: {args.question}\nA: {answer.text}")
    if answer.citations:
        best = answer.citations[0]
        more = f" (and {len(answer.citations) - 1} more place(s))" if len(answer.citations) > 1 else ""
        source = next(p for p in answer.passages if p.id == best.passage_id)
        field = source.title if best.field == "title" else source.text
        print(f"cited: {best.passage_id} ({best.field} [{best.start}:{best.end}]){more}: {_marked(field, best)}")
    elif answer.passages and model.task.cites_passages:
        print("cited: nowhere: no passage read holds this answer")
    for rank, passage in enumerate(answer.passages[: args.show], start=1):
        text = passage.text if len(passage.text) < 300 else passage.text[:297] + "..."
        print(f"  [{rank}] {passage.title or passage.id} (score {passage.score or 0:.3f}): {text}")
    return 0


def _marked(text: str, span, context: int = 80) -> str:
    """The cited words of `text` between »« with up to `context` characters either side, on one line."""
    before = text[max(0, span.start - context) : span.start]
    after = text[span.end : span.end + context]
    line = ("..." if span.start > context else "") + before + "»" + text[span.start : span.end] + "«" + after
    return " ".join((line + ("..." if span.end + context < len(text) else "")).split())
