"""Which scaled-dot-product-attention kernels the reader's passes that take gradients may use.

Every attention of the reader (the T5 decoder's, a T5 encoder's, the warm-started reader's BERT-family
encoder) runs through `torch.nn.functional.scaled_dot_product_attention` (transformers' "sdpa"), always
with an explicit mask: T5 folds its position bias and the padding into one additive mask. On an
H100/H200, PyTorch picks cuDNN's kernel for bfloat16 inputs with a mask, and that kernel's backward
returned NaN in its first output (the gradient of the queries) inside the warm-started reader's
decoder for some batches while the forward stayed finite; the reading recipe under
`training.precision=bf16` then stopped at its first step (docs/troubleshooting.md, "bf16 training on
CUDA gives NaN losses"). PyTorch's issue 196678 describes the same failure: cuDNN's backward with an
explicit mask, query rows' gradient NaN, depending on the key length.

So a pass that takes gradients runs under `training_attention()`: the backends PyTorch may choose
from are those of `training_sdpa_backends()`, cuDNN's left out. The choice is made where the pass
runs (the readers' `forward`, decorated `@with_training_attention`, and the recomputation of an
activation-checkpointed block, which runs during the backward: `checkpoint_contexts`), so every
caller that trains (the training loop, DeepSpeed, the benchmarks, the tests) gets it. Passes without
gradients (answering, gold scores) keep PyTorch's own choice: cuDNN's forward is finite, and the
backward is the part in question.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# the environment variable that replaces the default list: comma-separated SDPBackend names, e.g.
# "MATH" (the reference kernel) or "CUDNN_ATTENTION,FLASH_ATTENTION,EFFICIENT_ATTENTION,MATH" (PyTorch's own set)
TRAINING_SDPA_BACKENDS_ENV = "ATLAS_TRAINING_SDPA_BACKENDS"
# FLASH takes no arbitrary mask, so T5's passes run EFFICIENT on CUDA (MATH where it does not apply) and
# FLASH or MATH on the CPU, as PyTorch's default does there
DEFAULT_TRAINING_SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
KERNEL_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION")

P = ParamSpec("P")
R = TypeVar("R")


def training_sdpa_backends() -> list[SDPBackend]:
    """The SDPA backends a pass that takes gradients may use: `ATLAS_TRAINING_SDPA_BACKENDS` where set,
    else `DEFAULT_TRAINING_SDPA_BACKENDS` (cuDNN's left out). ValueError naming the variable and the valid
    names for an unknown or empty list."""
    setting = os.environ.get(TRAINING_SDPA_BACKENDS_ENV)
    names = DEFAULT_TRAINING_SDPA_BACKENDS if setting is None else [n.strip() for n in setting.split(",") if n.strip()]
    unknown = [name for name in names if name not in KERNEL_BACKENDS]
    if unknown or not names:
        problem = f"unknown backend {unknown[0]!r}" if unknown else "no backend named"
        raise ValueError(
            f"{TRAINING_SDPA_BACKENDS_ENV}={setting!r}: {problem}; "
            f"valid: a comma-separated list of {list(KERNEL_BACKENDS)}"
        )
    return [getattr(SDPBackend, name) for name in names]


@contextlib.contextmanager
def training_attention() -> Iterator[None]:
    """Inside, while gradients are enabled (checked on entry), scaled-dot-product attention may use only
    `training_sdpa_backends()`; without gradients, nothing changes. The previous choice is restored
    on exit."""
    if not torch.is_grad_enabled():
        yield
        return
    with sdpa_kernel(training_sdpa_backends()):
        yield


def with_training_attention(forward: Callable[P, R]) -> Callable[P, R]:
    """Decorator: `forward` runs under `training_attention()` when gradients are enabled, and is called
    as it is without them (a decoding step pays one check)."""

    @functools.wraps(forward)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        with sdpa_kernel(training_sdpa_backends()):
            return forward(*args, **kwargs)

    return run


def checkpoint_contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """`torch.utils.checkpoint`'s `context_fn`: nothing around a checkpointed block's forward (the
    reader's `forward` already chose), `training_attention()` around its recomputation in the backward,
    which runs outside that `forward`."""
    return contextlib.nullcontext(), training_attention()
