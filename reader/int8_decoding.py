"""Decoding with int8 linear layers: `inference.precision: int8` (and `bf16-int8`, and `auto` on a CPU).

The decoder's and the LM head's linear layers are swapped for PyTorch's dynamically quantised ones (int8
weights per output channel, activations quantised per batch on the fly) while `generate` runs; the encoder
and the copy head stay in float32. Measured on SQuAD dev (docs/results/speed.md), int8 in the decoder keeps
the answers, while int8 in the reader's encoder costs several EM points, whichever of its layers are
quantised. Dynamic quantisation runs on CPUs only.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator

import torch
from torch import nn
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic


def int8_supported(device: torch.device) -> bool:
    """Whether int8 decoding can run on `device`: a CPU with one of PyTorch's quantised engines for x86
    or Arm."""
    engines = set(torch.backends.quantized.supported_engines)
    return device.type == "cpu" and bool(engines & {"x86", "fbgemm", "onednn", "qnnpack"})


# What `inference.precision` may say: the encoder pass's precision and whether the decoder runs in int8
ANSWERING_PRECISIONS = ("auto", "fp32", "bf16", "int8", "bf16-int8")


def answering_plan(precision: str, device: torch.device) -> tuple[str, bool]:
    """An `inference.precision` → (the encoder pass's precision for `FiDReader.encode`: "fp32", "bf16" or "auto";
    whether the decoder and LM head run in int8). "auto": int8 decoding and a float32 encoder where `device` can
    decode in int8 (a CPU: the answers held, while a bf16 encoder moved some: docs/results/speed.md), else the
    encoder in bf16 where the hardware multiplies it natively. ValueError for an unknown name."""
    if precision not in ANSWERING_PRECISIONS:
        raise ValueError(f"unknown inference precision {precision!r}; valid: {list(ANSWERING_PRECISIONS)}")
    if precision == "auto":
        return ("fp32", True) if int8_supported(device) else ("auto", False)
    return {"fp32": ("fp32", False), "bf16": ("bf16", False), "int8": ("fp32", True), "bf16-int8": ("bf16", True)}[
        precision
    ]


def partitioned(module: nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 holds `module`'s weights partitioned over the ranks (`ds_id` on its parameters):
    each rank's tensors are empty outside a forward, so there is no whole weight to quantise."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def quantized_copy(module: nn.Module) -> nn.Module:
    """A copy of `module` whose `nn.Linear` layers are dynamically quantised to int8, weights per channel."""
    with warnings.catch_warnings():  # the migration notice to torchao: the eager API is what runs here
        warnings.simplefilter("ignore")
        if isinstance(module, nn.Linear):  # quantize_dynamic swaps children only
            return quantize_dynamic(nn.Sequential(copy.deepcopy(module)), {nn.Linear: per_channel_dynamic_qconfig})[0]
        return quantize_dynamic(module, {nn.Linear: per_channel_dynamic_qconfig})  # a copy: inplace=False


class Int8Decoding:
    """The int8 copies of one seq2seq model's decoder and LM head, made again when their weights change
    (a training step, a loaded checkpoint)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._parts: dict[str, nn.Module] = {}

    @staticmethod
    def _weights_key(seq2seq: nn.Module) -> tuple:
        params = [*seq2seq.decoder.parameters(), *seq2seq.lm_head.parameters()]
        return tuple((p.data_ptr(), p._version) for p in params)

    @contextlib.contextmanager
    def applied(self, seq2seq: nn.Module) -> Iterator[None]:
        """Within the block, `seq2seq.decoder` and `seq2seq.lm_head` are their int8 copies (eval mode only)."""
        if seq2seq.training:
            raise ValueError("int8 decoding is for answering: call eval() first")
        device = next(seq2seq.parameters()).device
        if not int8_supported(device):
            raise ValueError(f"inference.precision int8 runs on a CPU only, not on {device}")
        if partitioned(seq2seq):
            raise ValueError(
                "inference.precision int8 needs each rank to hold the whole decoder, which DeepSpeed ZeRO-3 "
                "partitions: answer at fp32 or auto (auto then decodes in float32)"
            )
        key = self._weights_key(seq2seq)
        if key != self._key:
            self._parts = {name: quantized_copy(getattr(seq2seq, name)) for name in ("decoder", "lm_head")}
            self._key = key
        originals = {name: getattr(seq2seq, name) for name in self._parts}
        try:
            for name, part in self._parts.items():
                setattr(seq2seq, name, part)
            yield
        finally:
            for name, part in originals.items():
                setattr(seq2seq, name, part)
