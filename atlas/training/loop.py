"""The training recipe: a plain loop you can read top to bottom.

`TrainingRecipe`: setup (model, data, optimizers) → train: for each step (`train_step`)
accumulate `accumulation_steps` micro-batches (each loss divided by that number), clip, step
both optimizers and schedulers, log → evaluate and save on schedule → final save and
evaluation → cleanup, which closes the log also when a step raised. Everything needed to
continue exactly — both optimizers and schedulers, RNG states, the data position
(`atlas.training.train_data`) — is in each checkpoint; the metrics log is `atlas.training.run_log`.
`training.steps: 0` evaluates the model as the recipe builds it and writes no checkpoint (its
weights are the reader's and retriever's own; `atlas evaluate READER --index IDX` does the same
without a recipe). Metrics are in percent (`tasks.metrics`), in the log, the evaluations and the summary.

With `training.deepspeed` the reader runs inside a DeepSpeed ZeRO engine
(`atlas.training.deepspeed_engine`): its backward divides by the accumulation steps and its step
clips and steps the reader's optimizer and schedule; the retriever's are stepped here as
always. A checkpoint stores the global batch (batch × accumulation × ranks); resuming on a
different number of ranks keeps it by changing the per-rank batch.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from atlas.config import AtlasConfig, save_config
from atlas.distributed import (
    DistributedContext,
    average_gradients,
    init_distributed,
    no_sync_unless,
)
from atlas.evaluate import evaluate, recall_drops, retriever_recall
from atlas.loading import checkpoint_config, load_model, recipe_spec, resolve_checkpoint
from atlas.model import AtlasModel
from atlas.run_index import prepare_index
from atlas.training.checkpoint import (
    claim_run_folder,
    config_for_world_size,
    disk_report,
    global_batch_size,
    load_training_state,
    save_checkpoint,
    set_rng_state,
)
from atlas.training.deepspeed_engine import (
    DeepSpeedReader,
    load_deepspeed_config,
    require_deepspeed,
)
from atlas.training.refresh import RefreshRange, parse_refresh_schedule, refresh_due, refresh_index
from atlas.training.run_log import RunLog, logged_recall
from atlas.training.train_data import DataPosition, ExampleStream, load_training_examples
from common.io import atomic_write_json
from common.progress import progress_bar as tqdm
from tasks.base import Example, Task, get_task
from tasks.score import check_labelled

logger = logging.getLogger(__name__)


def lr_multiplier(step: int, *, warmup: int, total: int, kind: str) -> float:
    """Learning-rate factor after `step` optimizer steps: linear warm-up, then linear/cosine/constant."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class Optimizers:
    """The run's AdamW optimizers, each with its learning-rate schedule, by name.

    A checkpoint stores the schedules as one list, the reader's first (`schedules`)."""

    reader: torch.optim.Optimizer
    reader_schedule: LambdaLR
    retriever: torch.optim.Optimizer | None = None
    retriever_schedule: LambdaLR | None = None

    @property
    def schedules(self) -> list[LambdaLR]:
        """The schedules in the order a checkpoint's `schedulers` list holds them."""
        return [s for s in (self.reader_schedule, self.retriever_schedule) if s is not None]

    def stepped_by_loop(self, *, deepspeed: bool) -> list[tuple[torch.optim.Optimizer, LambdaLR]]:
        """The (optimizer, schedule) pairs the loop steps itself: DeepSpeed steps the reader's."""
        pairs = [] if deepspeed else [(self.reader, self.reader_schedule)]
        if self.retriever is not None:
            pairs.append((self.retriever, self.retriever_schedule))
        return pairs

    def state_dicts(self, reader_state: dict | None) -> dict:
        """The optimizers' part of a training state; `reader_state`: the reader's AdamW state
        (gathered by DeepSpeed when it holds the reader)."""
        return {
            "reader_optimizer": reader_state,
            "retriever_optimizer": self.retriever.state_dict() if self.retriever else None,
            "schedulers": [s.state_dict() for s in self.schedules],
        }

    def load_state_dicts(self, state: dict, deepspeed: DeepSpeedReader | None) -> None:
        """Restore what `state_dicts` saved (the reader's AdamW through DeepSpeed when it holds it)."""
        if deepspeed is not None:
            deepspeed.load_optimizer_state(state["reader_optimizer"])
        else:
            self.reader.load_state_dict(state["reader_optimizer"])
        if self.retriever is not None:
            self.retriever.load_state_dict(state["retriever_optimizer"])
        for schedule, saved in zip(self.schedules, state["schedulers"]):
            schedule.load_state_dict(saved)


def make_optimizers(model, config: AtlasConfig) -> Optimizers:
    """AdamW for the reader (`lr`; its encoder `lr_encoder` when set) and, when the retriever
    trains, for it (`lr_retriever`), each with the `training.scheduler` schedule. Frozen
    parameters are left out."""
    t = config.training
    encoder_ids = {id(p) for p in model.reader.seq2seq.encoder.parameters()} if t.lr_encoder is not None else set()
    trainable = [p for p in model.reader.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in encoder_ids], "lr": t.lr}]
    if encoder_ids:
        groups.append({"params": [p for p in trainable if id(p) in encoder_ids], "lr": t.lr_encoder})
    reader = torch.optim.AdamW([g for g in groups if g["params"]], lr=t.lr, weight_decay=t.weight_decay)
    retriever = None
    if model.trains_retriever:
        params = [p for p in model.retriever.parameters() if p.requires_grad]
        if params:
            retriever = torch.optim.AdamW(params, lr=t.lr_retriever, weight_decay=t.weight_decay)
    schedule = lambda step: lr_multiplier(step, warmup=t.warmup_steps, total=t.steps, kind=t.scheduler)
    return Optimizers(
        reader=reader,
        reader_schedule=LambdaLR(reader, schedule),
        retriever=retriever,
        retriever_schedule=LambdaLR(retriever, schedule) if retriever is not None else None,
    )


class NonFiniteLoss(ArithmeticError):
    """A training step's loss is NaN or infinite: the run stops before the optimizer steps."""


def check_finite(step: int, step_losses: dict[str, float], context, output_dir) -> None:
    """Stop the run, on every rank together, before a non-finite loss reaches the weights: the
    optimizer would turn them into NaN and every later checkpoint with them."""
    finite = all(math.isfinite(v) for v in step_losses.values())
    if context.enabled:  # every rank stops, or none does (a lone rank leaving would hang the others)
        flag = torch.tensor([1.0 if finite else 0.0], device=context.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        finite = bool(flag.item())
    if not finite:
        values = ", ".join(f"{k} {v:.4g}" for k, v in step_losses.items())
        raise NonFiniteLoss(
            f"training step {step}: the loss is not finite ({values}); the run stopped before the optimizer "
            f"step, so the weights and the checkpoints in {output_dir}/checkpoints are as they were. Causes "
            "seen: training.precision=bf16 on CUDA with the shipped reader (use fp32 there), a learning rate "
            "far too high (training.lr). See docs/troubleshooting.md."
        )


@dataclass
class RecallGuard:
    """The guard against a retriever loss that makes retrieval worse: the retriever's answer
    recall on training questions at the start (kept in the log, so that a resumed run compares
    with the same figure) and at every evaluation. Every rank searches (a sharded index searches
    in lockstep)."""

    examples: list[Example]
    ks: list[int]
    loss_name: str
    before: dict[str, float] | None = None

    @classmethod
    def start(
        cls, model, examples: list[Example], config: AtlasConfig, log: RunLog | None, logged: Path | None
    ) -> RecallGuard | None:
        """The guard of a run whose retriever trains against an index (None otherwise); its
        starting recall is read from `logged` (a resumed run's log) or measured and logged now."""
        questions = [e for e in examples if e.answers and not e.passages][: config.evaluation.train_recall_examples]
        if not (questions and model.trains_retriever and model.index is not None):
            return None
        guard = cls(
            questions, sorted({config.reader.n_context, config.retriever.n_context}), config.retriever.loss.name
        )
        guard.before = logged_recall(logged) if logged is not None else None
        if guard.before is None:
            model.eval()
            guard.before = retriever_recall(model, guard.examples, guard.ks)
            if log is not None:
                log.write(0, {f"train_recall/{k}": v for k, v in guard.before.items()})
        return guard

    def check(self, model, step: int, log: RunLog | None) -> dict[str, float]:
        """Recall now; logged, with a warning for each figure that dropped since the start."""
        model.eval()
        now = retriever_recall(model, self.examples, self.ks)
        if log is not None:
            log.write(step, {f"train_recall/{k}": v for k, v in now.items()})
            dropped = recall_drops(self.before or {}, now)
            if dropped:
                logger.warning(
                    "step %d: the retriever loss '%s' lowered answer recall on %d training questions "
                    "(%s); check its temperatures and lr_retriever",
                    step,
                    self.loss_name,
                    len(self.examples),
                    ", ".join(dropped),
                )
        return now


def _resolve_run(
    config: AtlasConfig | None, resume: str | Path | None, context: DistributedContext
) -> tuple[AtlasConfig, Path | None, dict | None]:
    """→ (the run's config, the checkpoint it resumes from, that checkpoint's training state);
    a resumed run takes the checkpoint's config with the per-rank batch that keeps its global batch."""
    if resume is None:
        return config, None, None
    checkpoint = resolve_checkpoint(resume)
    state = load_training_state(checkpoint)
    return config_for_world_size(checkpoint_config(checkpoint), state, context.world_size), checkpoint, state


class TrainingRecipe:
    """setup → train (a loop over `train_step`, evaluating and saving on schedule) → cleanup.

    `train()` below runs it; `cleanup` runs whether or not a step raised."""

    # built by `setup`
    model: AtlasModel
    task: Task
    optimizers: Optimizers
    engine: torch.nn.Module  # what the step calls: the model, or DDP around it
    deepspeed: DeepSpeedReader | None  # holds the reader under `training.deepspeed`
    stream: ExampleStream
    refresh_schedule: list[RefreshRange]
    passage_side_trains: bool  # the passage encoder trains: the index goes stale
    guard: RecallGuard | None
    autocast: torch.autocast

    def __init__(
        self,
        config: AtlasConfig | None,
        *,
        resume: str | Path | None = None,
        progress: bool = True,
        stop_at: int | None = None,
        context: DistributedContext | None = None,
        model: AtlasModel | None = None,
        overwrite: bool = False,
    ):
        self.context = context or init_distributed()
        if resume is None and config is not None:
            # a folder holding this same run is continued; another run's is refused (or replaced: overwrite,
            # by rank 0, before the other ranks look)
            if self.context.is_main:
                resume = claim_run_folder(config, overwrite=overwrite, resume_same=model is None)
            self.context.barrier()
            if not self.context.is_main:
                resume = claim_run_folder(config, resume_same=model is None)
        self.prebuilt = model  # a model to train as it is (the Python API's `fit`), instead of one built from config
        self.config, self.checkpoint, self.resumed_state = _resolve_run(config, resume, self.context)
        self.progress = progress
        self.stop_at = stop_at
        self.output_dir = Path(self.config.training.output_dir)
        self.log: RunLog | None = None
        self.bar = None
        self.step = 0
        self.losses: list[float] = []  # the total loss of each step of this session
        self.metrics: dict = {}  # the latest evaluation

    # ---------------------------------------------------------------- setup
    def setup(self) -> None:
        """Build the model, data, optimizers (and DDP or DeepSpeed around them), restore a resumed
        run's state, open the log, refresh the index when a resumed passage encoder moved on."""
        config, context, t = self.config, self.context, self.config.training
        ds_config = None
        if t.deepspeed:  # fail before the model is built: a missing extra or a bad JSON file
            require_deepspeed()
            ds_config = load_deepspeed_config(t.deepspeed, t, context.world_size)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if context.is_main:
            save_config(config, self.output_dir / "config.yaml")
        torch.manual_seed(t.seed)
        random.seed(t.seed)

        # every input is checked before any work (the model, an index build): file, line and field
        self.task = get_task(config.task.name, **config.task.options)
        if config.task.eval_data:  # an evaluation file without gold answers fails now, not after training
            check_labelled(
                self.task,
                config.task.eval_data[0],
                self.task.load(config.task.eval_data[0], skip_invalid=config.task.skip_invalid),
            )
        examples = load_training_examples(config, self.task)
        if self.prebuilt is not None:
            self.model = model = self.prebuilt.to(context.device)
        else:
            # built (or linked from the cache) once
            index = prepare_index(config, checkpoint=self.checkpoint, progress=self.progress)
            spec = recipe_spec(config, checkpoint=self.checkpoint, index=index)
            self.model = model = load_model(spec, context=context)
        if context.is_main:
            atomic_write_json(self.output_dir / "train_examples.json", [e.id for e in examples])
        self.optimizers = make_optimizers(model, config)
        self.engine, self.deepspeed = model, None
        if ds_config is not None:  # the reader inside DeepSpeed; the retriever keeps its own AdamW
            self.deepspeed = DeepSpeedReader(
                model.reader,
                self.optimizers.reader,
                self.optimizers.reader_schedule,
                ds_config=ds_config,
                context=context,
            )
        elif context.enabled:
            # unused: the retriever's parameters when its loss is `none`, the reader's lm head in MC scoring
            self.engine = DistributedDataParallel(model, find_unused_parameters=True)
        self.stream = ExampleStream(examples, self.task, t.seed)
        if self.resumed_state is not None:
            self._restore(self.resumed_state)
        resume_step = self.step if self.checkpoint is not None else None
        self.log = RunLog(self.output_dir, resume_step=resume_step) if context.is_main else None
        self.refresh_schedule = parse_refresh_schedule(config.index.refresh)
        self.passage_side_trains = model.trains_retriever and any(
            p.requires_grad for p in model.retriever.passage_encoder.parameters()
        )
        if self.checkpoint is not None and self.passage_side_trains and self.refresh_schedule:
            self.refresh()  # the saved passage encoder has moved on since the index was built
        self.guard = RecallGuard.start(
            model, examples, config, self.log, self.output_dir / "log.jsonl" if self.checkpoint is not None else None
        )
        if len(config.task.eval_data) > 1 and context.is_main:
            logger.warning(
                "training evaluates on %s only (the first of task.eval_data); `atlas evaluate` scores the others",
                config.task.eval_data[0],
            )
        self.autocast = torch.autocast(
            model.reader.seq2seq.device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16"
        )

    def _restore(self, state: dict) -> None:
        """Continue where the checkpoint stopped: optimizers and schedules, data position, step, RNGs."""
        self.optimizers.load_state_dicts(state, self.deepspeed)
        self.stream.position = DataPosition(**state["data_position"])
        self.step = state["step"]
        set_rng_state(state["rng"])
        logger.info("resumed from %s at step %d", self.checkpoint, self.step)

    # ---------------------------------------------------------------- the loop
    def train(self) -> dict:
        """Steps until `training.steps` (or `stop_at`), then the final save and evaluation; → the summary."""
        t = self.config.training
        self.bar = tqdm(
            total=t.steps,
            initial=self.step,
            desc="training",
            disable=not (self.progress and self.context.is_main),
            dynamic_ncols=True,
        )
        started, first_step = time.perf_counter(), self.step
        end = t.steps if self.stop_at is None else min(self.stop_at, t.steps)
        while self.step < end:
            step_losses = self.train_step()
            self.step += 1
            self.losses.append(step_losses["total"])
            if self.passage_side_trains and refresh_due(self.step, self.refresh_schedule):
                self.refresh()
            self._log_step(step_losses, rate=(self.step - first_step) / max(1e-9, time.perf_counter() - started))
            if t.eval_every and self.step % t.eval_every == 0 and self.step < t.steps:
                self.metrics = self.evaluate()
            if t.save_every and self.step % t.save_every == 0 and self.step < t.steps:
                self.save()
        self.bar.close()
        # nothing trained, nothing to save: the weights are those the recipe names
        final = self.save() if t.steps > 0 else None
        if self.step == t.steps:
            self.metrics = self.evaluate()
        return self._summary(final)

    def train_step(self) -> dict[str, float]:
        """One optimizer step over a global batch of `accumulation_steps` micro-batches (each loss
        divided by their number); → the mean of each loss over the global batch."""
        t, context, deepspeed = self.config.training, self.context, self.deepspeed
        self.model.train()
        step_losses: dict[str, float] = {}
        for micro in range(t.accumulation_steps):
            # every rank draws the same global batch and keeps its own slice of it
            batch, targets = self.stream.next_batch(t.batch_size * context.world_size)
            mine = slice(context.rank * t.batch_size, (context.rank + 1) * t.batch_size)
            with no_sync_unless(micro == t.accumulation_steps - 1, self.engine):
                with self.autocast:  # the forward pass only (backward runs in the forward's dtypes)
                    parts = self.engine(batch[mine], targets[mine])
                if deepspeed is not None:
                    deepspeed.backward(parts["total"])  # divides by the accumulation steps itself
                else:
                    (parts["total"] / t.accumulation_steps).backward()
            for name, value in parts.items():
                step_losses[name] = step_losses.get(name, 0.0) + value.item() / t.accumulation_steps
        check_finite(self.step + 1, step_losses, context, self.output_dir)
        if deepspeed is not None and self.optimizers.retriever is not None:  # no DDP around the retriever
            average_gradients(self.model.retriever.parameters(), context)
        stepped = self.optimizers.stepped_by_loop(deepspeed=deepspeed is not None)
        for optimizer, _ in stepped:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, t.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for _, schedule in stepped:
            schedule.step()
        if context.enabled:  # log the global batch's mean, as one process with the whole batch would
            values = torch.tensor(list(step_losses.values()), dtype=torch.float64)
            torch.distributed.all_reduce(values)
            step_losses = dict(zip(step_losses, (values / context.world_size).tolist()))
        return step_losses

    def _log_step(self, step_losses: dict[str, float], *, rate: float) -> None:
        """The log line of a step (every `log_every` steps and the last) and the progress bar."""
        t = self.config.training
        lr = self.optimizers.reader_schedule.get_last_lr()[0]
        if self.log is not None and (self.step % max(1, t.log_every) == 0 or self.step == t.steps):
            self.log.write(
                self.step, {**{f"loss/{k}": v for k, v in step_losses.items()}, "lr": lr, "steps_per_s": rate}
            )
        self.bar.set_postfix(
            {k: f"{v:.4f}" for k, v in step_losses.items()} | {"lr": f"{lr:.2e}"}, refresh=False
        )  # drawn by update(), at most every mininterval
        self.bar.update(1)

    # ---------------------------------------------------------------- save, refresh, evaluate
    def save(self) -> Path | None:
        """Checkpoint the current step (rank 0 writes it; → its folder there, None elsewhere)."""
        t, context = self.config.training, self.context
        # under DeepSpeed every rank takes part in gathering the reader's weights and Adam state
        reader_weights, reader_state = (
            self.deepspeed.consolidated_state(self.step)
            if self.deepspeed is not None
            else (None, self.optimizers.reader.state_dict())
        )
        path = None
        if context.is_main:
            if self.log is not None:
                self.log.sync()
            training_state = {
                **self.optimizers.state_dicts(reader_state),
                "data_position": vars(self.stream.position).copy(),
                "world_size": context.world_size,
                "global_batch": global_batch_size(t.batch_size, t.accumulation_steps, context.world_size),
            }
            path = save_checkpoint(
                self.output_dir,
                self.step,
                model=self.model,
                config=self.config,
                keep_last=t.keep_last,
                reader_weights=reader_weights,
                training_state=training_state,
            )
        context.barrier()
        return path

    def refresh(self) -> None:
        """Re-embed the corpus with the current passage encoder and search that index from now on."""
        refresh_index(
            self.model,
            self.model.passage_index.corpora[0].path,
            self.output_dir / "index-refreshed",
            self.config,
            context=self.context,
        )
        if self.log is not None:
            self.log.write(self.step, {"index_refreshed": 1.0})

    def evaluate(self) -> dict:
        """The recall guard's check and the metrics on the first of `task.eval_data` at this step."""
        config, context, step = self.config, self.context, self.step
        recall_now = self.guard.check(self.model, step, self.log) if self.guard is not None else {}
        if not config.task.eval_data:
            return {f"train_recall/{k}": v for k, v in recall_now.items()}
        out_dir = self.output_dir / f"eval-step-{step:06d}" if context.is_main else None
        # each rank predicts its share (a sharded index is searched in lockstep) and rank 0 scores;
        # but ZeRO-3 gathers parameters in every forward, so there all ranks generate the same
        # examples in lockstep (split shares would stop generating at different steps)
        lockstep = self.deepspeed is not None and self.deepspeed.forward_needs_all_ranks
        metrics = evaluate(
            self.model,
            self.task,
            config.task.eval_data[0],
            config.evaluation,
            out_dir=out_dir,
            run_config=config,
            context=None if lockstep else context,
        )
        if self.log is not None:
            self.log.write(step, {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
        context.barrier()
        return {**metrics, **{f"train_recall/{k}": v for k, v in recall_now.items()}}

    # ---------------------------------------------------------------- the end
    def _summary(self, final: Path | None) -> dict:
        """The run's summary (see `train`); rank 0 also writes it to `summary.json`."""
        t = self.config.training
        summary = {
            "step": self.step,
            "losses": self.losses,
            "eval": self.metrics,
            "checkpoint": str(final) if final else None,
        }
        if final is not None:
            summary["disk"] = disk_report(self.output_dir, final, keep_last=t.keep_last)
        elif self.context.is_main:
            logger.info("training.steps is 0: evaluated the model as built, no checkpoint written")
        if self.guard is not None:
            summary["train_recall_before"] = self.guard.before
        if self.log is not None:
            atomic_write_json(self.output_dir / "summary.json", summary)
        return summary

    def cleanup(self) -> None:
        """Close the progress bar and the log, also when a step raised."""
        if self.bar is not None:
            self.bar.close()
        if self.log is not None:
            self.log.close()


def train(
    config: AtlasConfig | None,
    *,
    resume: str | Path | None = None,
    progress: bool = True,
    stop_at: int | None = None,
    context: DistributedContext | None = None,
    model: AtlasModel | None = None,
    overwrite: bool = False,
) -> dict:
    """Run the recipe `config` (or continue the run in `resume`); returns the final summary.
    `model`: train this model in place instead of building the one `config` describes (its index is the
    model's own). `training.output_dir` holding a run of the same config continues it; another run there is
    refused unless `overwrite` (then it is deleted first).

    `stop_at` ends this session after that step with a checkpoint (no final evaluation), as
    a job that runs out of its time slot would; `resume` then carries on to `training.steps`.
    Under `torchrun` each of the N ranks reads `training.batch_size` examples of every global
    batch of N × batch_size, gradients are averaged by DDP (or DeepSpeed), and rank 0 saves
    and evaluates. A resumed run keeps the checkpoint's global batch at any number of ranks.

    Summary: {"step", "losses": [total loss per step], "eval": metrics (percent), "checkpoint": path or
    None (`training.steps: 0`: evaluated, nothing trained, no checkpoint written), "disk": what the
    run folder holds (`atlas.training.checkpoint.disk_report`; absent without a checkpoint)}.
    """
    recipe = TrainingRecipe(
        config, resume=resume, progress=progress, stop_at=stop_at, context=context, model=model, overwrite=overwrite
    )
    try:
        recipe.setup()
        return recipe.train()
    finally:
        recipe.cleanup()
