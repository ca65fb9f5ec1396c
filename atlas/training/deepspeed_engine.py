"""DeepSpeed ZeRO (stages 1–3) for the reader, behind the few calls the training loop makes.

With `training.deepspeed: configs/deepspeed/zero3.json` the reader (the FiD T5, by far the
largest part of the model) is handed to `deepspeed.initialize` together with the run's own
torch AdamW and learning-rate schedule; the retriever keeps its own AdamW outside DeepSpeed.
What changes in the loop, and nothing else:

* `backward(loss)` replaces `(loss / accumulation_steps).backward()`: DeepSpeed divides by its
  `gradient_accumulation_steps` (= `training.accumulation_steps`; the loop does not divide as
  well), reduces the reader's gradients across ranks at the last micro-batch, clips them to
  `training.clip_norm` and steps the reader's optimizer and schedule there;
* `consolidated_state()` gathers the reader's weights and its Adam moments into the same
  plain formats as a run without DeepSpeed (a Hugging Face T5 folder, a torch AdamW state
  dict), and `load_optimizer_state()` scatters them back into any ZeRO stage at any world
  size, so a checkpoint from N ranks resumes on M ranks (see docs/guides/scale-out.md).

The JSON config's batch sizes, accumulation and clipping belong to `training.*`: leave them
out or set them to "auto" (as in the shipped `configs/deepspeed/zero{1,2,3}.json`); a value
that disagrees is an error, as are `optimizer`/`scheduler` sections (the run's own are used)
and fp16/bf16 weights (`training.precision: bf16` autocasts with fp32 weights instead).

DeepSpeed is an optional extra (`pip install 'atlas-rag[deepspeed]'`). Its first start
compiles a small communication op into `~/.cache/torch_extensions` (about a minute on a CPU).
Tested with DeepSpeed 0.19.8. The public `safe_get/set_full_optimizer_state` move the moments;
creating Adam's state before the first step of a resumed run (`_materialise_optimizer_state`)
and setting its step count reach into ZeRO's optimizer (its inner torch optimizer and flat
fp32 partitions, as DeepSpeed's own universal-checkpoint loader does): the resume tests in
tests/atlas/test_deepspeed.py guard those few lines against DeepSpeed upgrades.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from atlas.config import ConfigError, TrainingConfig
from atlas.distributed import DistributedContext

logger = logging.getLogger(__name__)

_MOMENTS = ("exp_avg", "exp_avg_sq")  # torch AdamW's per-parameter state besides "step"


def require_deepspeed():
    """The `deepspeed` module, or an ImportError that says how to install it."""
    try:
        import deepspeed  # optional: deepspeed (an extra), only for training.deepspeed
    except ImportError as error:
        raise ImportError(
            "training.deepspeed is set but DeepSpeed is not installed: pip install 'atlas-rag[deepspeed]' "
            f"(or pip install deepspeed), or remove training.deepspeed to train with plain DDP ({error})"
        ) from None
    return deepspeed


def load_deepspeed_config(path: str | Path, training: TrainingConfig, world_size: int) -> dict[str, Any]:
    """Read a DeepSpeed JSON config and fill in what `training.*` owns.

    Raises `ConfigError` naming the file and the key: unreadable JSON, a ZeRO stage other
    than 1–3, an `optimizer`/`scheduler` section, fp16/bf16 weights, or a batch size,
    accumulation or clipping value that disagrees with `training.*`.
    """
    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"training.deepspeed: {path}: file not found") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"training.deepspeed: {path}: invalid JSON: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"training.deepspeed: {path}: the top level must be a JSON object")

    stage = (config.get("zero_optimization") or {}).get("stage")
    if stage not in (1, 2, 3):
        raise ConfigError(
            f"{path}: 'zero_optimization.stage' must be 1, 2 or 3, got {stage!r} "
            "(for plain data parallelism leave training.deepspeed unset: atlas uses DDP)"
        )
    for section, instead in (
        ("optimizer", "training.lr, training.weight_decay"),
        ("scheduler", "training.scheduler, training.warmup_steps"),
    ):
        if section in config:
            raise ConfigError(
                f"{path}: remove '{section}': atlas passes DeepSpeed its own AdamW and "
                f"learning-rate schedule, configured by {instead}"
            )
    for precision in ("fp16", "bf16"):
        enabled = (config.get(precision) or {}).get("enabled", False)
        if enabled is True:
            raise ConfigError(
                f"{path}: '{precision}.enabled' is not supported: the reader keeps fp32 weights (the retriever "
                "and its loss stay outside DeepSpeed); set training.precision: bf16 for bf16 autocast"
            )
        config.pop(precision, None)  # "auto" or false: nothing to enable

    # JSON keys that `training.*` owns (key → (value, where it comes from)): filled in when absent or "auto",
    # checked when given
    ours = {
        "train_micro_batch_size_per_gpu": (training.batch_size, "training.batch_size"),
        "gradient_accumulation_steps": (training.accumulation_steps, "training.accumulation_steps"),
        "train_batch_size": (
            training.batch_size * training.accumulation_steps * world_size,
            "training.batch_size × accumulation_steps × world size",
        ),
        "gradient_clipping": (float(training.clip_norm), "training.clip_norm"),
    }
    for key, (value, source) in ours.items():
        given = config.get(key, "auto")
        if given != "auto" and given != value:
            raise ConfigError(
                f"{path}: '{key}' is {given!r} but {source} gives {value!r}; "
                f'set it to "auto" (atlas fills it in from training.*)'
            )
        config[key] = value
    config.setdefault("steps_per_print", 2**31 - 1)  # atlas logs the losses itself
    return config


def _ensure_process_group(context: DistributedContext) -> None:
    """DeepSpeed needs a process group even for one process: create a 1-rank group (in memory,
    no port) when `torchrun` did not start one. It is kept for the life of the process:
    DeepSpeed caches its groups, so a later engine in this process (a resumed run in a notebook
    or a test) must find the same one."""
    os.environ.setdefault("LOCAL_RANK", str(context.local_rank))  # DeepSpeed's start-up check reads it
    if not dist.is_initialized():
        backend = "nccl" if context.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


class DeepSpeedReader:
    """The reader inside a DeepSpeed engine (ZeRO stage 1, 2 or 3).

    Args:
        reader: the `FiDReader` (its parameters are those of `optimizer`, in the same order).
        optimizer: the reader's torch AdamW (one parameter group).
        scheduler: its LambdaLR schedule (DeepSpeed steps it at each optimizer step).
        ds_config: from `load_deepspeed_config`.
        context: this process's rank and world size.

    The training loop keeps calling `model.reader` (the module DeepSpeed wraps, whose ZeRO-3
    hooks gather partitioned parameters for every sub-module call); only backward, step,
    checkpointing and resuming go through this object.
    """

    def __init__(
        self,
        reader: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        *,
        ds_config: dict[str, Any],
        context: DistributedContext,
    ):
        deepspeed = require_deepspeed()
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # its per-step INFO lines drown the log
        if len(optimizer.param_groups) != 1:
            raise ValueError(
                f"the reader's optimizer has {len(optimizer.param_groups)} parameter groups; "
                "checkpoint consolidation supports one (leave training.lr_encoder unset)"
            )
        if any(not p.requires_grad for p in reader.parameters()):
            raise ValueError(
                "under DeepSpeed the whole reader trains (checkpoint consolidation covers every "
                "parameter): leave reader.trainable_encoder_layers unset"
            )
        self.context = context
        _ensure_process_group(context)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=reader, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        self.stage = self.engine.zero_optimization_stage()

    @property
    def forward_needs_all_ranks(self) -> bool:
        """ZeRO-3 partitions the weights: every forward pass all-gathers them, so evaluation must
        run on every rank in lockstep (not on rank 0 alone)."""
        return self.stage == 3 and self.context.enabled

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss (not divided: DeepSpeed divides by its
        `gradient_accumulation_steps`), then the engine's step, which reduces, clips and steps
        the reader's optimizer and schedule only at the last micro-batch of the window."""
        self.engine.backward(loss)
        self.engine.step()

    # ------------------------------------------------------------------ checkpoints
    def consolidated_state(self, step: int) -> tuple[dict[str, torch.Tensor] | None, dict | None]:
        """Gather the reader's full weights and Adam state onto rank 0's CPU, one parameter at a
        time (every rank must call this: the gathers are collectives).

        Returns, on rank 0 (None, None elsewhere):
            weights: under ZeRO-3, the T5 state dict {name: tensor of the parameter's full
                shape, e.g. (V, H) for `shared.weight`} (tied names share one tensor), for
                `T5ForConditionalGeneration.save_pretrained(state_dict=…)`; None under
                ZeRO-1/2, whose module holds the full weights on every rank;
            optimizer: a torch AdamW `state_dict()` over the reader's parameters, in their
                order: {"state": {i: {"step": scalar, "exp_avg", "exp_avg_sq": the
                parameter's full shape}}, "param_groups": [{hyper-parameters, "params"}]},
                the same format a run without DeepSpeed saves. "step" is `step`, the
                optimizer steps taken (ZeRO steps every parameter at every step).
        """
        # optional: deepspeed (an extra); this runs only under an engine require_deepspeed() made
        from deepspeed import zero
        from deepspeed.utils import safe_get_full_optimizer_state

        main = self.context.is_main
        module = self.engine.module
        stepped = step > 0  # ZeRO creates Adam's moments at the first optimizer step
        full: dict[int, torch.Tensor] = {}
        state: dict[int, dict[str, torch.Tensor]] = {}
        for index, param in enumerate(module.parameters()):
            with zero.GatheredParameters([param]):  # a no-op below stage 3
                if main:  # (below stage 3 only its shape is needed; the weights are saved from the module)
                    full[id(param)] = param.detach().to("cpu", copy=True) if self.stage == 3 else param.detach()
            if stepped:
                moments = {key: safe_get_full_optimizer_state(param, key) for key in _MOMENTS}
                if main:
                    state[index] = {
                        "step": torch.tensor(float(step)),
                        **{
                            key: value.detach().to("cpu", copy=True).reshape(full[id(param)].shape)
                            for key, value in moments.items()
                        },
                    }
        if not main:
            return None, None
        weights = None
        if self.stage == 3:
            weights = {
                name.removeprefix("seq2seq."): full[id(param)]
                for name, param in module.named_parameters(remove_duplicate=False)
            }
            weights.update({name.removeprefix("seq2seq."): b.detach().cpu() for name, b in module.named_buffers()})
        group = {key: value for key, value in self.optimizer.param_groups[0].items() if key != "params"}
        return weights, {"state": state, "param_groups": [{**group, "params": list(range(len(full)))}]}

    def load_optimizer_state(self, saved: dict) -> None:
        """Scatter a consolidated (or plain torch AdamW) reader optimizer state into the engine.

        Works for any ZeRO stage and any world size: each rank keeps its own slice of every
        full moment tensor. Parameters without saved state (never stepped in a plain run) start
        from zero moments; the Adam step count is the largest saved one.
        """
        from deepspeed.utils import safe_set_full_optimizer_state  # optional: deepspeed (an extra), as above

        if len(saved["param_groups"]) != 1:
            raise ValueError(f"saved reader optimizer has {len(saved['param_groups'])} parameter groups; expected 1")
        hyper = {key: value for key, value in saved["param_groups"][0].items() if key != "params"}
        for group in self.optimizer.param_groups:
            group.update(hyper)  # lr as of the saved step (the schedule's state is restored separately)
        if not saved["state"]:
            return
        params = list(self.engine.module.parameters())
        if len(saved["param_groups"][0]["params"]) != len(params):
            raise ValueError(
                f"saved reader optimizer covers {len(saved['param_groups'][0]['params'])} parameters, "
                f"the reader has {len(params)}"
            )
        self._materialise_optimizer_state()
        for index, param in enumerate(params):
            entry = saved["state"].get(index, {})
            shape = param.ds_shape if hasattr(param, "ds_shape") else param.shape  # ZeRO-3: the full shape
            for key in _MOMENTS:
                value = entry[key] if key in entry else torch.zeros(shape)
                safe_set_full_optimizer_state(param, value.to(self.context.device, torch.float32), key)
        step = max(float(entry["step"]) for entry in saved["state"].values())
        inner = self.optimizer.optimizer  # the torch AdamW over ZeRO's flat fp32 partitions
        for _, flat in self._flat_partitions():
            old = inner.state[flat]["step"]
            inner.state[flat]["step"] = torch.full_like(old, step) if torch.is_tensor(old) else step

    def _flat_partitions(self) -> list[tuple[int, torch.Tensor]]:
        """(parameter group, flat fp32 partition) pairs that ZeRO's inner AdamW steps. ZeRO-1/2
        keep them in the groups; ZeRO-3 keeps sub-groups aside and puts each into its group only
        for the duration of its step."""
        zero = self.optimizer
        if hasattr(zero, "fp32_partitioned_groups_flat"):  # ZeRO-3
            return [(zero.sub_group_to_group_id[i], flat) for i, flat in enumerate(zero.fp32_partitioned_groups_flat)]
        return [(i, flat) for i, group in enumerate(zero.optimizer.param_groups) for flat in group["params"]]

    def _materialise_optimizer_state(self) -> None:
        """Create Adam's state on ZeRO's flat partitions before the first step, so that saved
        moments can be written into it: one step of the inner torch AdamW with zero gradients
        at learning rate 0 (weights unchanged: decay ×(1 − 0·wd), update 0·m/√v), as
        torch.distributed.checkpoint does; then link ZeRO-1/2's per-parameter views to it."""
        inner = self.optimizer.optimizer
        flats = self._flat_partitions()
        if all(inner.state.get(flat) for _, flat in flats):
            return
        saved = [(group["params"], group["lr"]) for group in inner.param_groups]
        for group in inner.param_groups:
            group["params"], group["lr"] = [], 0.0
        for index, flat in flats:
            inner.param_groups[index]["params"].append(flat)
            flat.grad = torch.zeros_like(flat)
        inner.step()
        for group, (params, lr) in zip(inner.param_groups, saved):
            group["params"], group["lr"] = params, lr
        for _, flat in flats:
            flat.grad = None
        link = getattr(self.optimizer, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO-1/2 only
        if link is not None:
            link()
