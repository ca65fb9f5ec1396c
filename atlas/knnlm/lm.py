"""kNN-LM keys: hidden states of a language model captured by forward hooks, and datastore building.

Works with any causal LM from `transformers` whose blocks we can locate (GPT-2 style
`transformer.h`, LLaMA style `model.layers`) and with a T5 model's decoder run with teacher
forcing (the decoder reads the text itself; the encoder reads a fixed prompt, by default
just the end-of-sequence token).

Key specs are `"{type}:{block}"` with a Python-style block index (`-1` = last block):
  layer_output   the block's output (the residual stream after the block)
  ffn_input      the input of the feed-forward sublayer, i.e. after its layer norm
                 (Khandelwal et al.'s best key, at the last block)
  attn_output    the attention sublayer's output before the residual add (Xu et al.)
  ffn_output     the feed-forward sublayer's output before the residual add (Xu et al.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from atlas.knnlm.datastore import (
    MANIFEST,
    PRODUCER_FIELDS,
    Datastore,
    DatastoreWriter,
    fill_datastore,
)
from retriever.fingerprint import hash_json, hash_state_dict, hash_tokenizer


@dataclass(frozen=True)
class BlockParts:
    """Where the hookable sublayers of one architecture live."""

    blocks: Callable[[nn.Module], nn.ModuleList]
    attention: Callable[[nn.Module], nn.Module]  # block → attention module
    feed_forward: Callable[[nn.Module], nn.Module]  # block → FFN core (its input is post-layer-norm)


ARCHITECTURES: dict[str, BlockParts] = {
    "gpt2": BlockParts(lambda m: m.transformer.h, lambda b: b.attn, lambda b: b.mlp),
    "llama": BlockParts(lambda m: m.model.layers, lambda b: b.self_attn, lambda b: b.mlp),
    "t5": BlockParts(
        lambda m: m.decoder.block,
        lambda b: b.layer[0].SelfAttention,
        lambda b: b.layer[-1].DenseReluDense,
    ),
}


def architecture_of(model: nn.Module) -> str:
    """Registry name for `model`, from its structure; ValueError lists the supported ones."""
    if hasattr(model, "decoder") and hasattr(model.decoder, "block"):
        return "t5"
    if hasattr(model, "transformer") and hasattr(model.transformer, "h"):
        return "gpt2"
    if hasattr(model, "model") and hasattr(model.model, "layers"):
        return "llama"
    raise ValueError(f"cannot locate the blocks of {type(model).__name__}; supported layouts: {sorted(ARCHITECTURES)}")


# key type → (sublayer finder, whether the key is the module's input rather than its output)
KEY_TYPES: dict[str, tuple[Callable[[BlockParts, nn.Module], nn.Module], bool]] = {
    "layer_output": (lambda parts, block: block, False),
    "ffn_input": (lambda parts, block: parts.feed_forward(block), True),
    "attn_output": (lambda parts, block: parts.attention(block), False),
    "ffn_output": (lambda parts, block: parts.feed_forward(block), False),
}


def parse_key_spec(spec: str, n_blocks: int) -> tuple[str, int]:
    """'ffn_input:-1' → ('ffn_input', n_blocks - 1); ValueError names the valid types and range."""
    kind, _, layer = spec.partition(":")
    if kind not in KEY_TYPES:
        raise ValueError(f"unknown key type '{kind}' in '{spec}'; valid types: {sorted(KEY_TYPES)}")
    try:
        index = int(layer) if layer else -1
    except ValueError:
        raise ValueError(f"key spec '{spec}': block index '{layer}' is not an integer") from None
    if not -n_blocks <= index < n_blocks:
        raise ValueError(f"key spec '{spec}': block index must be in [{-n_blocks}, {n_blocks - 1}]")
    return kind, index % n_blocks


class KeyedLM:
    """Runs a language model on token windows and returns logits plus the requested hidden states.

    `__call__(input_ids (B, T)) -> (logits (B, T, V), {spec: (B, T, d)})`; logits at position t
    predict token t+1. Hooks are registered once and only read while a call is in progress.
    """

    def __init__(
        self,
        model: nn.Module,
        key_specs: Iterable[str],
        *,
        encoder_input_ids: list[int] | None = None,
    ):
        self.model = model.eval()
        self.architecture = architecture_of(model)
        parts = ARCHITECTURES[self.architecture]
        blocks = parts.blocks(model)
        self.key_specs = list(dict.fromkeys(key_specs))
        if self.architecture == "t5" and encoder_input_ids is None:
            encoder_input_ids = [model.config.eos_token_id]
        self.encoder_input_ids = encoder_input_ids
        self._captured: dict[str, torch.Tensor] | None = None
        self._handles = []
        for spec in self.key_specs:
            kind, index = parse_key_spec(spec, len(blocks))
            find, is_input = KEY_TYPES[kind]
            module = find(parts, blocks[index])
            register = module.register_forward_pre_hook if is_input else module.register_forward_hook
            self._handles.append(register(self._capture_hook(spec, is_input)))

    def _capture_hook(self, spec: str, is_input: bool):
        """A forward pre-hook (`is_input`: (module, args)) or forward hook ((module, args, output)) that
        stores the key while a call is in progress."""

        def hook(module, args, output=None):
            if self._captured is not None:
                value = args[0] if is_input else output
                if isinstance(value, (tuple, list)):  # attention modules (and some blocks): hidden state first
                    value = value[0]
                self._captured[spec] = value.detach()

        return hook

    def remove(self) -> None:
        """Detach the hooks from the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters (inputs are moved there)."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        input_ids = input_ids.to(self.device)
        self._captured = {}
        try:
            if self.architecture == "t5":
                encoder_ids = torch.tensor([self.encoder_input_ids] * len(input_ids), device=self.device)
                logits = self.model(input_ids=encoder_ids, decoder_input_ids=input_ids).logits
            else:
                logits = self.model(input_ids=input_ids).logits
            captured = self._captured
        finally:
            self._captured = None
        missing = [spec for spec in self.key_specs if spec not in captured]
        if missing:
            raise RuntimeError(f"hooks for {missing} did not fire on {type(self.model).__name__}")
        return logits, captured

    def key_dims(self) -> dict[str, int]:
        """Width d of every requested key (one dummy forward pass)."""
        _, keys = self(torch.zeros((1, 2), dtype=torch.long))
        return {spec: int(value.shape[-1]) for spec, value in keys.items()}


def load_lm(path: str | Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """A causal LM (or a T5 model) from a local folder; a lone config.json builds a fresh model."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM  # heavy: only to load a model

    path = Path(path)
    config_path = path if path.is_file() else path / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{path}: neither a model folder with config.json nor a config file")
    config = AutoConfig.from_pretrained(config_path.parent if path.is_dir() else path)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    has_weights = path.is_dir() and any(path.glob("*.safetensors"))
    model = auto.from_pretrained(path) if has_weights else auto.from_config(config)
    return model.to(device).eval()


def tokenize_text_file(path: str | Path, tokenizer) -> np.ndarray:
    """Token ids (N,) int64 of a text file: each line's tokens followed by the EOS token.

    The EOS-per-line convention is WikiText's (`<eos>` at every newline).
    """
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no EOS token to mark line ends")
    ids: list[int] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            ids.extend(tokenizer(line.strip(), add_special_tokens=False)["input_ids"])
            ids.append(tokenizer.eos_token_id)
    return np.asarray(ids, dtype=np.int64)


def lm_producer(keyed_lm: KeyedLM):
    """A datastore producer: windows (B, T) → float16 keys and float32 log p_LM(target) (B, T)."""

    def produce(windows: np.ndarray, targets: np.ndarray):
        logits, keys = keyed_lm(torch.from_numpy(windows))
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        target_ids = torch.from_numpy(targets).to(logprobs.device).unsqueeze(-1)
        target_logprobs = logprobs.gather(-1, target_ids).squeeze(-1)  # (B, T)
        return (
            {spec: value.to(torch.float16).cpu().numpy() for spec, value in keys.items()},
            target_logprobs.cpu().numpy().astype(np.float32),
        )

    return produce


def model_fingerprint(model: nn.Module) -> str:
    """SHA-256 of a model's configuration and weights: what produced a datastore's keys.

    The config is taken as JSON without bookkeeping entries (`_name_or_path`,
    `transformers_version`, other `_`-prefixed keys), so the same weights loaded from another
    folder or saved by another library version give the same fingerprint; the weights are
    hashed by name, dtype, shape and bytes (`retriever.fingerprint.hash_state_dict`).
    """
    config = getattr(model, "config", None)
    settings = {}
    if config is not None:
        settings = {
            k: v
            for k, v in json.loads(config.to_json_string(use_diff=False)).items()
            if not k.startswith("_") and k != "transformers_version"
        }
    return hash_json({"config": settings, "weights": hash_state_dict(model.state_dict())})


def token_ids_fingerprint(token_ids: np.ndarray) -> str:
    """SHA-256 of a token stream (as int64), so that an edited text is never taken for the old one."""
    return hashlib.sha256(np.ascontiguousarray(token_ids, dtype=np.int64).tobytes()).hexdigest()


def producer_meta(
    model: nn.Module,
    keyed: KeyedLM,
    *,
    tokenizer=None,
    fingerprint: str | None = None,
) -> dict:
    """The `PRODUCER_FIELDS` of a datastore built by `model` (and `tokenizer`, when known)."""
    return {
        "architecture": keyed.architecture,
        "model_fingerprint": fingerprint or model_fingerprint(model),
        "tokenizer_fingerprint": None if tokenizer is None else hash_tokenizer(tokenizer),
        "encoder_input_ids": keyed.encoder_input_ids,
    }


def check_datastore_producer(path: str | Path, expected: dict) -> None:
    """Refuse a datastore folder (complete or half-built) made by another model or tokenizer.

    `expected` holds the `PRODUCER_FIELDS` of the model about to use (or resume) it. A folder
    without a manifest is new and passes; one whose manifest predates fingerprints cannot be
    verified and is refused too.
    """
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.exists():
        return
    meta = json.loads(manifest_path.read_text()).get("meta", {})
    if "model_fingerprint" not in meta:
        raise ValueError(
            f"{path}: datastore has no model fingerprint (built by an older version), so it "
            "cannot be checked against this model; delete it or use a new folder"
        )
    for field in PRODUCER_FIELDS:
        if meta.get(field) != expected.get(field):
            what = {
                "model_fingerprint": "model (configuration or weights)",
                "tokenizer_fingerprint": "tokenizer",
                "architecture": "architecture",
                "encoder_input_ids": "T5 encoder prompt",
            }[field]
            raise ValueError(
                f"{path}: datastore was built with a different {what}: "
                f"{field} {meta.get(field)!r} there, {expected.get(field)!r} here; "
                "use the model it was built with, or a new folder"
            )


def build_datastore(
    path: str | Path,
    model: nn.Module,
    token_ids: np.ndarray,
    key_specs: list[str],
    *,
    context: int,
    stride: int,
    batch_size: int = 8,
    progress: bool = True,
    meta: dict | None = None,
    tokenizer=None,
    fingerprint: str | None = None,
) -> Datastore:
    """Build (or resume building) the datastore of `model` over `token_ids` (N,) for `key_specs`.

    Rows: N-1 (key at position t, value token t+1); also stores log p_LM(value), so the same
    call over a test text gives its sliding-window perplexity and its kNN queries.

    The manifest records the producer (`producer_meta`: model fingerprint, tokenizer
    fingerprint when `tokenizer` is given, architecture, T5 prompt) and a hash of the token
    stream; an existing folder made by another model, tokenizer or text is refused, never
    resumed or reused. `fingerprint`: a precomputed `model_fingerprint(model)` (hashing the
    weights of a large model takes a while).
    """
    keyed = KeyedLM(model, key_specs)
    try:
        producer = producer_meta(model, keyed, tokenizer=tokenizer, fingerprint=fingerprint)
        check_datastore_producer(path, producer)
        meta = {
            "context": context,
            "stride": stride,
            **producer,
            "n_tokens": len(token_ids),
            "first_ids": [int(t) for t in token_ids[:16]],
            "tokens_sha256": token_ids_fingerprint(token_ids),
            **(meta or {}),
        }
        writer = DatastoreWriter(
            path,
            n_rows=len(token_ids) - 1,
            key_dims=keyed.key_dims(),
            with_lm_logprobs=True,
            meta=meta,
        )
        return fill_datastore(
            writer,
            token_ids,
            lm_producer(keyed),
            context=context,
            stride=stride,
            batch_size=batch_size,
            progress=progress,
        )
    finally:
        keyed.remove()
