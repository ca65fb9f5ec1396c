"""`atlas train|evaluate|ask`: the jobs that run the whole model.

`evaluate`, `ask` (and `serve`) take a run folder, a checkpoint folder, or a reader to run without
training: a reader folder, the shipped reader's name (`atlas-reader`) or a reader preset, with
`--index`. A reader runs with the index's own encoder as retriever and the settings of the default
recipe, `atlas/demo/quickstart.yaml` (the shipped reader's: its decoding and passages read), so
that `atlas evaluate atlas-reader` scores what the quickstart's "no fine-tuning" row scores.
"""

# Lazy imports: the handlers import the model, training and evaluation modules (torch, transformers, faiss)
# when they run, so that `atlas --help` and argument errors answer at once.

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

MODEL_HELP = (
    "a run folder, a checkpoint folder, or a reader to run without training: a reader folder, "
    "'atlas-reader' (the shipped reader) or a reader preset (then --index is required)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the model-running commands to the `atlas` parser."""
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
        summary = train(load_config(args.config, args.overrides), stop_at=args.stop_at)
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


@dataclass
class ModelSource:
    """What `atlas evaluate|ask|serve` run: a checkpoint folder, or a reader (a folder or a preset
    name, `reader.model`) to run without training."""

    checkpoint: Path | None = None
    reader: str | None = None


def shipped_readers() -> dict[str, Path]:
    """Readers that ship with atlas, by name."""
    from atlas.demo.quickstart import SHIPPED_READER

    return {"atlas-reader": SHIPPED_READER}


def resolve_model(name: str) -> ModelSource:
    """A run folder or a checkpoint folder (→ its checkpoint), a reader folder (with config.json),
    a shipped reader's name or a reader preset (→ the reader); else FileNotFoundError naming what
    was looked for."""
    from atlas.training.checkpoint import resolve_checkpoint
    from reader.fid import READER_PRESETS, WARM_START_PRESETS

    path = Path(name)
    try:
        return ModelSource(checkpoint=resolve_checkpoint(path))
    except FileNotFoundError:
        pass
    if (path / "config.json").is_file():
        return ModelSource(reader=str(path.resolve()))
    shipped = shipped_readers()
    if not path.exists() and name in shipped:
        return ModelSource(reader=str(shipped[name]))
    if not path.exists() and (name in READER_PRESETS or name in WARM_START_PRESETS):
        logger.warning("reader preset %s is randomly initialised: expect scores near 0", name)
        return ModelSource(reader=name)
    hint = ""
    if (path / "config.yaml").is_file():
        hint = (
            "; it has a config.yaml but no checkpoint (a run of training.steps 0 writes none): run the reader "
            "its reader.model names, with --index"
        )
    raise FileNotFoundError(
        f"{name}: neither a run, a checkpoint nor a reader: looked for checkpoints/latest (a run folder), "
        f"latest or config.yaml with reader/ (a checkpoint folder), config.json (a reader folder), a shipped "
        f"reader ({', '.join(shipped)}) and the reader presets "
        f"({', '.join(sorted(READER_PRESETS | WARM_START_PRESETS))})" + hint
    )


def _index_encoder(index: str) -> list[str]:
    """Overrides that embed queries' passages as `index` was built (its manifest's encoder record)."""
    from retriever.index_files import read_manifest

    record = read_manifest(index).get("encoder") or {}
    return [
        f"retriever.{key}={json.dumps(record[key])}"
        for key in ("passage_format", "passage_maxlength")
        if record.get(key) is not None
    ]


def reader_config(reader: str, index: str, task: str | None = None, overrides: list[str] = ()):
    """The config that runs `reader` (a folder or a preset) without training: the default recipe
    (atlas/demo/quickstart.yaml: decoding, passages read, evaluation batch and retrieval_k) with
    `index` searched by the encoder its manifest records (all-MiniLM-L6-v2 where it records none),
    no retriever loss, no training data, `training.steps` 0, every example evaluated, `task`
    (default: the recipe's, qa); then `overrides`."""
    from atlas.config import load_config
    from atlas.demo.quickstart import RECIPE
    from retriever.index_files import read_manifest

    source = (read_manifest(index).get("encoder") or {}).get("source")
    if not source:
        logger.warning(
            "%s does not record the encoder it was built with; searching it with minilm "
            "(give retriever.model=ENCODER if it was another)",
            index,
        )
    settings = [
        f"reader.model={reader}",
        "reader.trainable_encoder_layers=null",
        f"retriever.model={source or 'minilm'}",
        "retriever.loss=none",
        f"index.path={index}",
        "index.corpus=null",
        "task.train_data=[]",
        "task.eval_data=[]",
        "task.shots=null",
        "training.steps=0",
        "evaluation.max_examples=null",
        *_index_encoder(index),
        *([f"task.name={task}", "task.options={}"] if task else []),
    ]
    return load_config(RECIPE, [*settings, *overrides])


def load_run(checkpoint: str | ModelSource, index: str | None, overrides: list[str], *, task: str | None = None):
    """Load a model for inference: → (its folder, its config with `overrides`, the built `Atlas`).

    `checkpoint`: a checkpoint folder, a run folder (its latest checkpoint), or a reader (a folder, a
    shipped reader's name, a preset; `resolve_model`), which needs `index` and runs with the default
    recipe (`reader_config`; `task` its task). `index`: an index folder to retrieve from instead of
    the run's; queries are then embedded with the passage format and length that index was built
    with (its manifest's encoder record)."""
    from atlas.build import build_atlas
    from atlas.training.checkpoint import checkpoint_config

    source = checkpoint if isinstance(checkpoint, ModelSource) else resolve_model(checkpoint)
    if source.reader is not None:
        if not index:
            raise ValueError(
                f"{source.reader} is a reader, not a run: it has no index of its own; give --index IDX "
                "(an index folder made by `atlas index build`)"
            )
        config = reader_config(source.reader, index, task, overrides)
        return Path(source.reader), config, build_atlas(config)
    extra = [f"index.path={index}", *_index_encoder(index)] if index else []
    config = checkpoint_config(source.checkpoint, [*overrides, *extra])
    return source.checkpoint, config, build_atlas(config, checkpoint=source.checkpoint)


def _evaluate(args: argparse.Namespace) -> int:
    """`atlas evaluate`: under torchrun every rank predicts its share of the examples (a sharded
    index is searched by all ranks in lockstep) and rank 0 writes the outputs and the metrics."""
    from atlas.distributed import init_distributed, shutdown
    from atlas.evaluate import evaluate
    from tasks.base import get_task

    context = init_distributed()  # before the model: a sharded index needs the process group
    try:
        source = resolve_model(args.checkpoint)
        folder, config, model = load_run(source, args.index, args.overrides, task=args.task)
        model.to(context.device)
        task_name, options = (args.task, {}) if args.task else (config.task.name, config.task.options)
        task = get_task(task_name, **options)
        if args.out:
            out = Path(args.out)
        elif source.reader is not None:  # never inside a reader folder (the shipped one is in the package)
            out = Path("runs") / f"eval-{folder.name}-{Path(args.data).stem}"
        else:
            out = folder / f"eval-{Path(args.data).stem}"
        # the config as evaluated: the checkpoint's, with this command's task, data and overrides
        recorded = dataclasses.replace(
            config,
            task=dataclasses.replace(config.task, name=task_name, options=dict(options), eval_data=[str(args.data)]),
        )
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
    from tasks.base import Example, get_task

    if not args.question.strip():
        raise SystemExit("atlas ask: the question is empty")
    _, config, model = load_run(args.checkpoint, args.index, [])
    model.eval()
    task = get_task(config.task.name, **config.task.options)
    example = Example(id="ask", query=task.query(args.question), target=None, answers=[])
    answers, passages = model.predict([example])
    print(f"Q: {args.question}\nA: {task.postprocess(example, answers[0])}")
    for rank, passage in enumerate((passages or [[]])[0][: args.show], start=1):
        text = passage.text if len(passage.text) < 300 else passage.text[:297] + "..."
        print(f"  [{rank}] {passage.title or passage.id} (score {passage.score or 0:.3f}): {text}")
    return 0
