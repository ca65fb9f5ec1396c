"""`atlas train|evaluate|ask`: the jobs that run the whole model."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the model-running commands to the `atlas` parser."""
    train = subparsers.add_parser("train", help="train reader + retriever from a YAML recipe")
    train.add_argument("config", nargs="?", help="a YAML recipe from configs/ (omit with --resume)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.lr=4e-5")
    train.add_argument("--resume", metavar="DIR", help="continue the run in DIR (its latest checkpoint)")
    train.add_argument("--stop-at", type=int, metavar="STEP",
                       help="end this session after STEP with a checkpoint (e.g. a job's time slot); "
                            "--resume continues to training.steps")
    train.set_defaults(func=_train)

    evaluate = subparsers.add_parser("evaluate", help="generate on a data file and score with the task's metrics")
    evaluate.add_argument("checkpoint", help="a checkpoint folder or a run folder")
    evaluate.add_argument("--data", required=True, help="examples to evaluate on")
    evaluate.add_argument("--index", help="index folder to retrieve from (default: the run's)")
    evaluate.add_argument("--task", help="task name (default: the run's)")
    evaluate.add_argument("--out", help="output folder (default: CHECKPOINT/eval-<data name>)")
    evaluate.add_argument("overrides", nargs="*", help="dotted overrides, e.g. evaluation.max_examples=100")
    evaluate.set_defaults(func=_evaluate)

    per_subject = subparsers.add_parser(
        "mmlu-per-subject",
        help="MMLU 5-shot per subject: fine-tune one model per subject on its dev split, evaluate it on "
             "its test split, merge all subjects into one per-category/overall table")
    per_subject.add_argument("config", help="the per-subject recipe, e.g. configs/mmlu-5shot.yaml")
    per_subject.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.steps=16")
    per_subject.add_argument("--data-dir", required=True, help="the MMLU root (with dev/ and test/ folders)")
    per_subject.add_argument("--subjects", help="comma-separated subjects (default: all that have dev and test)")
    per_subject.add_argument("--out", help="output folder (default: the recipe's training.output_dir)")
    per_subject.add_argument("--keep-checkpoints", action="store_true",
                             help="keep each subject's checkpoint (default: deleted once it is evaluated)")
    per_subject.set_defaults(func=_mmlu_per_subject)

    score = subparsers.add_parser("score", help="score a predictions file against gold with the task's metrics")
    score.add_argument("--task", required=True, help="qa, kilt, mmlu, fever")
    score.add_argument("--gold", required=True, help="gold examples (the task's own format; KILT jsonl for kilt)")
    score.add_argument("--pred", required=True,
                       help="predictions: {id|question, answer} lines, KILT's format for kilt, or the "
                            "predictions.jsonl of `atlas evaluate` (MMLU: with its probabilities)")
    score.set_defaults(func=_score)

    ask = subparsers.add_parser("ask", help="answer one question and show the evidence passages")
    ask.add_argument("checkpoint", help="a checkpoint folder or a run folder")
    ask.add_argument("question")
    ask.add_argument("--index", help="index folder to retrieve from (default: the run's)")
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
            raise SystemExit("atlas train: give a config (e.g. configs/quickstart.yaml) or --resume DIR")
        summary = train(load_config(args.config, args.overrides), stop_at=args.stop_at)
    print(json.dumps({"step": summary["step"], "final_loss": summary["losses"][-1] if summary["losses"] else None,
                      "eval": summary["eval"], "checkpoint": summary["checkpoint"]}, indent=2))
    return 0


def load_run(checkpoint: str, index: str | None, overrides: list[str]):
    """Load a run for inference: → (checkpoint folder, its config with `overrides`, the built `Atlas`).

    `checkpoint`: a checkpoint folder or a run folder (its latest checkpoint). `index`: an index
    folder to retrieve from instead of the run's; queries are then embedded with the passage
    format and length that index was built with (its manifest's encoder record)."""
    from atlas.build import build_atlas
    from atlas.training.checkpoint import checkpoint_config, resolve_checkpoint

    folder = resolve_checkpoint(checkpoint)
    extra = [f"index.path={index}"] if index else []
    if index:  # embed queries' passages as the index was built (its manifest's encoder record)
        from retriever.index_files import read_manifest

        record = read_manifest(index).get("encoder", {})
        extra += [f"retriever.{key}={json.dumps(record[key])}" for key in ("passage_format", "passage_maxlength")
                  if record.get(key) is not None]
    config = checkpoint_config(folder, [*overrides, *extra])
    return folder, config, build_atlas(config, checkpoint=folder)


def _evaluate(args: argparse.Namespace) -> int:
    """`atlas evaluate`: under torchrun every rank predicts its share of the examples (a sharded
    index is searched by all ranks in lockstep) and rank 0 writes the outputs and the metrics."""
    import dataclasses

    from atlas.distributed import init_distributed, shutdown
    from atlas.evaluate import evaluate
    from tasks.base import get_task

    context = init_distributed()  # before the model: a sharded index needs the process group
    try:
        folder, config, model = load_run(args.checkpoint, args.index, args.overrides)
        model.to(context.device)
        task_name, options = (args.task, {}) if args.task else (config.task.name, config.task.options)
        task = get_task(task_name, **options)
        out = Path(args.out) if args.out else folder / f"eval-{Path(args.data).stem}"
        # the config as evaluated: the checkpoint's, with this command's task, data and overrides
        recorded = dataclasses.replace(config, task=dataclasses.replace(
            config.task, name=task_name, options=dict(options), eval_data=[str(args.data)]))
        metrics = evaluate(model, task, args.data, config.evaluation, out_dir=out if context.is_main else None,
                           run_config=recorded, context=context)
        if context.is_main:
            if metrics:
                print(json.dumps(metrics, indent=2))
                print(f"predictions and metrics written to {out}")
            elif config.evaluation.write_predictions:
                print(f"{args.data}: no gold answers (an unlabelled test set): metrics skipped; "
                      f"predictions written to {out} (score them later with `atlas score`)")
            else:
                print(f"{args.data}: no gold answers (an unlabelled test set): metrics skipped, and "
                      "evaluation.write_predictions is false: nothing was written")
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
        metrics = run_per_subject(config, args.data_dir, out_dir=args.out, subjects=subjects,
                                  keep_checkpoints=args.keep_checkpoints, context=context)
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

    print(json.dumps(score_files(args.task, args.gold, args.pred), indent=2))
    return 0


def _ask(args: argparse.Namespace) -> int:
    from tasks.base import Example, get_task

    if not args.question.strip():
        raise SystemExit("atlas ask: the question is empty")
    _, config, model = load_run(args.checkpoint, args.index, [])
    model.eval()
    task = get_task(config.task.name, **config.task.options)
    query = task.query(args.question) if hasattr(task, "query") else args.question
    example = Example(id="ask", query=query, target=None, answers=[])
    answers, passages = model.predict([example])
    print(f"Q: {args.question}\nA: {task.postprocess(example, answers[0])}")
    for rank, passage in enumerate((passages or [[]])[0][: args.show], start=1):
        text = passage["text"] if len(passage["text"]) < 300 else passage["text"][:297] + "..."
        print(f"  [{rank}] {passage.get('title') or passage['id']} (score {passage.get('score', 0):.3f}): {text}")
    return 0
