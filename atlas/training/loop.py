"""The training recipe: a plain loop you can read top to bottom.

setup (model, data, optimizers) → for each step: accumulate `accumulation_steps` micro-batches
(each loss divided by that number), clip, step both optimizers and schedulers, log → evaluate
and save on schedule → final save and evaluation. Everything needed to continue exactly —
both optimizers and schedulers, RNG states, the data position — is in each checkpoint.
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

import json
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from atlas.build import build_atlas
from atlas.config import AtlasConfig, save_config
from atlas.distributed import (
    DistributedContext,
    average_gradients,
    init_distributed,
    no_sync_unless,
)
from atlas.evaluate import evaluate, recall_drops, retriever_recall
from atlas.training.checkpoint import (
    checkpoint_config,
    config_for_world_size,
    disk_report,
    global_batch_size,
    load_training_state,
    resolve_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from atlas.training.refresh import parse_refresh_schedule, refresh_due, refresh_index
from tasks.base import Example, get_task
from tasks.io import atomic_write_json, atomic_write_text
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
class DataPosition:
    """Where the example stream stands: the epoch and the offset in that epoch's order."""

    epoch: int = 0
    offset: int = 0


class ExampleStream:
    """Training examples in a seeded order per epoch; the position is saved for resuming.

    The target of an example is drawn per (seed, epoch, example) — e.g. a random gold
    answer per epoch — so that a resumed run draws exactly the same targets.
    """

    def __init__(self, examples: list[Example], task, seed: int, position: DataPosition | None = None):
        self.examples = examples
        self.task = task
        self.seed = seed
        self.position = position or DataPosition()

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(f"order-{self.seed}-{epoch}").shuffle(order)
        return order

    def next_batch(self, size: int) -> tuple[list[Example], list[str]]:
        """The next `size` examples with their targets (wrapping into the next epoch)."""
        if not self.examples:
            raise ValueError("no training examples (is task.train_data empty?)")
        batch, targets = [], []
        order = self._order(self.position.epoch)
        while len(batch) < size:
            if self.position.offset >= len(order):
                self.position = DataPosition(self.position.epoch + 1, 0)
                order = self._order(self.position.epoch)
            index = order[self.position.offset]
            example = self.examples[index]
            rng = random.Random(f"target-{self.seed}-{self.position.epoch}-{index}")
            query, target = self.task.training_pair(example, rng)
            batch.append(example if query == example.query else _with_query(example, query))
            targets.append(target)
            self.position.offset += 1
        return batch, targets


def _with_query(example: Example, query: str) -> Example:
    from dataclasses import replace

    return replace(example, query=query)


def _trainable(task, path, skip_invalid: bool) -> list[Example]:
    """The examples of `path` that have a training target. One without (e.g. a question with no
    answers, fine for prediction) is an InputError here, at start, instead of a crash at the step
    that draws it; with `skip_invalid` it is counted, logged and left out."""
    from tasks.io import InputError

    kept, skipped = [], 0
    for example in task.load(path, skip_invalid=skip_invalid):
        try:
            task.train_target(example, random.Random(0))
        except ValueError as error:
            if not skip_invalid:
                raise InputError(path, None, "answers", f"{error} (set task.skip_invalid=true to leave it out)") from None
            skipped += 1
            continue
        kept.append(example)
    if skipped:
        logger.warning("%s: %d example(s) without a training target skipped", path, skipped)
    return kept


def load_training_examples(config: AtlasConfig, task) -> list[Example]:
    """All examples of `task.train_data` (data files; for pretext tasks also prepared corpus
    folders, whose passage ids match the index's so that trivial retrievals are found), reduced
    to a seeded `task.shots` subset when set, then expanded by the task (MMLU's permutations)."""
    examples = [e for path in config.task.train_data for e in _trainable(task, path, config.task.skip_invalid)]
    if config.task.shots is not None:
        from tasks.fewshot import sample_shots

        examples = sample_shots(examples, config.task.shots, seed=config.training.seed)
    return task.training_examples(examples)


def make_optimizers(model, config: AtlasConfig):
    """AdamW for the reader (`lr`; its encoder `lr_encoder` when set) and, when the retriever
    trains, for it (`lr_retriever`). Frozen parameters are left out."""
    t = config.training
    encoder_ids = {id(p) for p in model.reader.t5.encoder.parameters()} if t.lr_encoder is not None else set()
    trainable = [p for p in model.reader.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in encoder_ids], "lr": t.lr}]
    if encoder_ids:
        groups.append({"params": [p for p in trainable if id(p) in encoder_ids], "lr": t.lr_encoder})
    reader_opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=t.lr, weight_decay=t.weight_decay)
    retriever_opt = None
    if model.trains_retriever:
        params = [p for p in model.retriever.parameters() if p.requires_grad]
        if params:
            retriever_opt = torch.optim.AdamW(params, lr=t.lr_retriever, weight_decay=t.weight_decay)
    schedule = lambda step: lr_multiplier(step, warmup=t.warmup_steps, total=t.steps, kind=t.scheduler)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in (reader_opt, retriever_opt) if o]
    return reader_opt, retriever_opt, schedulers


class _Log:
    """Console/TensorBoard/JSONL metrics: one line per logged step in `{output_dir}/log.jsonl`."""

    def __init__(self, output_dir: Path, resume_step: int | None):
        """`resume_step`: the step of the checkpoint a resumed run starts from (None: a new run).
        Lines logged after it by the interrupted run are dropped, so that the log of a resumed run
        equals the log of an uninterrupted one."""
        self.path = output_dir / "log.jsonl"
        if resume_step is not None and self.path.is_file():
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self.file = open(self.path, "a" if resume_step is not None else "w", encoding="utf-8")  # noqa: SIM115
        self.tensorboard = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(output_dir / "tensorboard"))
        except ImportError:  # tensorboard is an optional extra
            pass

    def write(self, step: int, values: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()
        if self.tensorboard is not None:
            for key, value in values.items():
                self.tensorboard.add_scalar(key, value, step)

    def close(self) -> None:
        self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


def _logged_recall(path: Path) -> dict[str, float] | None:
    """The retriever's answer recall on training questions at step 0, as the run logged it (None if absent)."""
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("step") == 0 and any(k.startswith("train_recall/") for k in record):
            return {k.removeprefix("train_recall/"): v for k, v in record.items() if k.startswith("train_recall/")}
    return None



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
            "far too high (training.lr). See docs/troubleshooting.md.")

def train(config: AtlasConfig | None, *, resume: str | Path | None = None, progress: bool = True,
          stop_at: int | None = None, context: DistributedContext | None = None) -> dict:
    """Run the recipe `config` (or continue the run in `resume`); returns the final summary.

    `stop_at` ends this session after that step with a checkpoint (no final evaluation), as
    a job that runs out of its time slot would; `resume` then carries on to `training.steps`.
    Under `torchrun` each of the N ranks reads `training.batch_size` examples of every global
    batch of N × batch_size, gradients are averaged by DDP (or DeepSpeed), and rank 0 saves
    and evaluates. A resumed run keeps the checkpoint's global batch at any number of ranks.

    Summary: {"step", "losses": [total loss per step], "eval": metrics (percent), "checkpoint": path or
    None (`training.steps: 0`: evaluated, nothing trained, no checkpoint written), "disk": what the
    run folder holds (`atlas.training.checkpoint.disk_report`; absent without a checkpoint)}.
    """
    from tasks.progress import progress_bar as tqdm

    context = context or init_distributed()
    checkpoint = state = None
    if resume is not None:
        checkpoint = resolve_checkpoint(resume)
        state = load_training_state(checkpoint)
        config = config_for_world_size(checkpoint_config(checkpoint), state, context.world_size)
    t = config.training
    ds_config = None
    if t.deepspeed:  # fail before the model is built: a missing extra or a bad JSON file
        from atlas.training.deepspeed_engine import load_deepspeed_config, require_deepspeed

        require_deepspeed()
        ds_config = load_deepspeed_config(t.deepspeed, t, context.world_size)
    output_dir = Path(t.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if context.is_main:
        save_config(config, output_dir / "config.yaml")
    torch.manual_seed(t.seed)
    random.seed(t.seed)

    # ---- setup
    model = build_atlas(config, checkpoint=checkpoint).to(context.device)
    task = get_task(config.task.name, **config.task.options)
    if config.task.eval_data:  # an evaluation file without gold answers fails now, not after training
        check_labelled(task, config.task.eval_data[0],
                       task.load(config.task.eval_data[0], skip_invalid=config.task.skip_invalid))
    examples = load_training_examples(config, task)
    if context.is_main:
        atomic_write_json(output_dir / "train_examples.json", [e.id for e in examples])
    reader_opt, retriever_opt, schedulers = make_optimizers(model, config)
    engine, deepspeed = model, None
    if ds_config is not None:  # the reader inside DeepSpeed; the retriever keeps its own AdamW
        from atlas.training.deepspeed_engine import DeepSpeedReader

        deepspeed = DeepSpeedReader(model.reader, reader_opt, schedulers[0], ds_config=ds_config, context=context)
    elif context.enabled:
        from torch.nn.parallel import DistributedDataParallel

        # unused: the retriever's parameters when its loss is `none`, the reader's lm head in MC scoring
        engine = DistributedDataParallel(model, find_unused_parameters=True)
    # what this loop steps itself (DeepSpeed steps the reader's optimizer and schedule)
    own_optimizers = [o for o in (None if deepspeed else reader_opt, retriever_opt) if o is not None]
    own_schedulers = schedulers[1:] if deepspeed else schedulers
    stream = ExampleStream(examples, task, t.seed)
    step = 0
    if state is not None:
        if deepspeed is not None:
            deepspeed.load_optimizer_state(state["reader_optimizer"])
        else:
            reader_opt.load_state_dict(state["reader_optimizer"])
        if retriever_opt is not None:
            retriever_opt.load_state_dict(state["retriever_optimizer"])
        for scheduler, saved in zip(schedulers, state["schedulers"]):
            scheduler.load_state_dict(saved)
        stream.position = DataPosition(**state["data_position"])
        step = state["step"]
        set_rng_state(state["rng"])
        logger.info("resumed from %s at step %d", checkpoint, step)
    log = _Log(output_dir, resume_step=step if checkpoint is not None else None) if context.is_main else None
    refresh_schedule = parse_refresh_schedule(config.index.refresh)
    passage_side_trains = model.trains_retriever and any(
        p.requires_grad for p in model.retriever.passage_encoder.parameters())

    def refresh() -> None:
        refresh_index(model, model.index.corpora[0].path, output_dir / "index-refreshed", config.index,
                      batch_size=config.retriever.batch_size, context=context)
        if log is not None:
            log.write(step, {"index_refreshed": 1.0})

    if checkpoint is not None and passage_side_trains and refresh_schedule:
        refresh()  # the saved passage encoder has moved on since the index was built

    def save(at_step: int) -> Path | None:
        # under DeepSpeed every rank takes part in gathering the reader's weights and Adam state
        reader_weights, reader_state = (deepspeed.consolidated_state(at_step) if deepspeed is not None
                                        else (None, reader_opt.state_dict()))
        path = None
        if context.is_main:
            path = save_checkpoint(output_dir, at_step, model=model, config=config, keep_last=t.keep_last,
                                   reader_weights=reader_weights,
                                   training_state={
                                       "reader_optimizer": reader_state,
                                       "retriever_optimizer": retriever_opt.state_dict() if retriever_opt else None,
                                       "schedulers": [s.state_dict() for s in schedulers],
                                       "data_position": vars(stream.position).copy(),
                                       "world_size": context.world_size,
                                       "global_batch": global_batch_size(t.batch_size, t.accumulation_steps,
                                                                         context.world_size),
                                   })
        context.barrier()
        return path

    # The guard against a retriever loss that makes retrieval worse: answer recall of the retriever on
    # training questions, at the start (kept in the log, so a resumed run compares with the same
    # figure) and at every evaluation. Every rank searches (a sharded index searches in lockstep).
    recall_examples = [e for e in examples if e.answers and not e.passages][: config.evaluation.train_recall_examples]
    recall_ks = sorted({config.reader.n_context, config.retriever.n_context})
    guard = bool(recall_examples) and model.trains_retriever and model.index is not None
    recall_before = _logged_recall(output_dir / "log.jsonl") if checkpoint is not None else None
    if guard and recall_before is None:
        model.eval()
        recall_before = retriever_recall(model, recall_examples, recall_ks)
        if log is not None:
            log.write(0, {f"train_recall/{k}": v for k, v in recall_before.items()})

    def check_recall(at_step: int) -> dict:
        if not guard:
            return {}
        model.eval()
        now = retriever_recall(model, recall_examples, recall_ks)
        if log is not None:
            log.write(at_step, {f"train_recall/{k}": v for k, v in now.items()})
            dropped = recall_drops(recall_before or {}, now)
            if dropped:
                logger.warning("step %d: the retriever loss '%s' lowered answer recall on %d training questions "
                               "(%s); check its temperatures and lr_retriever", at_step, config.retriever.loss,
                               len(recall_examples), ", ".join(dropped))
        return now

    if len(config.task.eval_data) > 1 and context.is_main:
        logger.warning("training evaluates on %s only (the first of task.eval_data); "
                       "`atlas evaluate` scores the others", config.task.eval_data[0])

    def run_eval(at_step: int) -> dict:
        recall_now = check_recall(at_step)
        if not config.task.eval_data:
            return {f"train_recall/{k}": v for k, v in recall_now.items()}
        out_dir = output_dir / f"eval-step-{at_step:06d}" if context.is_main else None
        if deepspeed is not None and deepspeed.forward_needs_all_ranks:
            # ZeRO-3 gathers parameters in every forward, so all ranks generate the same examples
            # in lockstep (split shares would stop generating at different steps)
            metrics = evaluate(model, task, config.task.eval_data[0], config.evaluation, out_dir=out_dir,
                               run_config=config)
        else:  # each rank predicts its share (a sharded index is searched in lockstep); rank 0 scores
            metrics = evaluate(model, task, config.task.eval_data[0], config.evaluation, out_dir=out_dir,
                               run_config=config, context=context)
        if log is not None:
            log.write(at_step, {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
        context.barrier()
        return {**metrics, **{f"train_recall/{k}": v for k, v in recall_now.items()}}

    # ---- the loop
    losses: list[float] = []
    autocast = torch.autocast(model.reader.t5.device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16")
    bar = tqdm(total=t.steps, initial=step, desc="training", disable=not (progress and context.is_main),
               dynamic_ncols=True)
    started, first_step = time.perf_counter(), step
    metrics: dict = {}
    end = t.steps if stop_at is None else min(stop_at, t.steps)
    while step < end:
        model.train()
        step_losses: dict[str, float] = {}
        for micro in range(t.accumulation_steps):
            # every rank draws the same global batch and keeps its own slice of it
            batch, targets = stream.next_batch(t.batch_size * context.world_size)
            mine = slice(context.rank * t.batch_size, (context.rank + 1) * t.batch_size)
            with no_sync_unless(micro == t.accumulation_steps - 1, engine):
                with autocast:  # the forward pass only (backward runs in the forward's dtypes)
                    parts = engine(batch[mine], targets[mine])
                if deepspeed is not None:
                    deepspeed.backward(parts["total"])  # divides by the accumulation steps itself
                else:
                    (parts["total"] / t.accumulation_steps).backward()
            for name, value in parts.items():
                step_losses[name] = step_losses.get(name, 0.0) + value.item() / t.accumulation_steps
        check_finite(step + 1, step_losses, context, output_dir)
        if deepspeed is not None and retriever_opt is not None:  # no DDP around the retriever
            average_gradients(model.retriever.parameters(), context)
        for optimizer in own_optimizers:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, t.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for scheduler in own_schedulers:
            scheduler.step()
        if context.enabled:  # log the global batch's mean, as one process with the whole batch would
            values = torch.tensor(list(step_losses.values()), dtype=torch.float64)
            torch.distributed.all_reduce(values)
            step_losses = dict(zip(step_losses, (values / context.world_size).tolist()))
        step += 1
        losses.append(step_losses["total"])
        if passage_side_trains and refresh_due(step, refresh_schedule):
            refresh()
        rate = (step - first_step) / max(1e-9, time.perf_counter() - started)
        if log is not None and (step % max(1, t.log_every) == 0 or step == t.steps):
            log.write(step, {**{f"loss/{k}": v for k, v in step_losses.items()},
                             "lr": schedulers[0].get_last_lr()[0], "steps_per_s": rate})
        bar.set_postfix({k: f"{v:.4f}" for k, v in step_losses.items()} | {"lr": f"{schedulers[0].get_last_lr()[0]:.2e}"},
                        refresh=False)  # drawn by update(), at most every mininterval
        bar.update(1)
        if t.eval_every and step % t.eval_every == 0 and step < t.steps:
            metrics = run_eval(step)
        if t.save_every and step % t.save_every == 0 and step < t.steps:
            save(step)
    bar.close()
    # nothing trained, nothing to save: the weights are those the recipe names
    final = save(step) if t.steps > 0 else None
    if step == t.steps:
        metrics = run_eval(step)
    summary = {"step": step, "losses": losses, "eval": metrics, "checkpoint": str(final) if final else None}
    if final is not None:
        summary["disk"] = disk_report(output_dir, final, keep_last=t.keep_last)
    elif context.is_main:
        logger.info("training.steps is 0: evaluated the model as built, no checkpoint written")
    if guard:
        summary["train_recall_before"] = recall_before
    if log is not None:
        log.close()
        atomic_write_json(output_dir / "summary.json", summary)
    return summary
