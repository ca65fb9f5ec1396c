"""Reference state dicts → Hugging Face models, with configs read from the tensors' shapes.

Atlas checkpoints hold no model config (the reference rebuilt the architecture from a hub
name), so the T5 config is inferred from shapes: sizes, layer counts, heads (the relative
attention bias is (buckets, heads)), gated or plain feed-forward (`wi_0`/`wi_1` or `wi`), and
tied output embeddings (`lm_head` absent or equal to `shared`: T5 v1.0, whose decoder output is
scaled by d_model^-0.5; v1.1 and lm-adapt keep their own `lm_head` and no scaling). BERT's head count is not in
any shape: it comes from a config file when one is given, else hidden_size / 64 (BERT-base,
BERT-large and Contriever all use 64-wide heads). Every tensor is checked against the model
it is loaded into, so a wrong shape or a stray key is named with its file, never half-loaded.

Two T5 tensors need more than loading: an `lm_head` of its own makes an
`UntiedT5ForConditionalGeneration` (saved as untied: `reader.t5_untied`), and the first decoder
block's cross-attention bias table, which only transformers < 4 saved (and used), is kept and
applied (`reader.cross_attention_bias`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, T5Config, T5ForConditionalGeneration

from common.io import InputError
from reader.cross_attention_bias import CROSS_BIAS_KEY, add_cross_attention_bias
from reader.t5_untied import UntiedT5ForConditionalGeneration

# Keys the reference may save that carry nothing a model needs: aliases of `shared` (tied
# token embeddings), BERT's position-id buffer and the pooler Contriever never uses.
_T5_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
_BERT_IGNORED = re.compile(r"^(embeddings\.position_ids|pooler\..*)$")


def _tensor(state: Mapping[str, torch.Tensor], key: str, source: str) -> torch.Tensor:
    if key not in state:
        raise InputError(source, None, key, "missing tensor (not a T5/BERT state dict of the expected layout)")
    value = state[key]
    if not isinstance(value, torch.Tensor):
        raise InputError(source, None, key, f"expected a tensor, got {type(value).__name__}")
    return value


def _count_blocks(state: Mapping[str, torch.Tensor], prefix: str, source: str) -> int:
    """How many layers `prefix{i}.…` keys hold; InputError when their numbers have a gap."""
    numbers = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    if numbers and numbers != set(range(len(numbers))):
        raise InputError(source, None, prefix, f"layers {sorted(numbers)} are not numbered 0..{len(numbers) - 1}")
    return len(numbers)


def _own_lm_head(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether `lm_head.weight` is a tensor of its own (T5 v1.1, lm-adapt), not absent or a copy of `shared.weight`."""
    lm_head, shared = state.get("lm_head.weight"), state["shared.weight"]
    return lm_head is not None and not (lm_head.shape == shared.shape and torch.equal(lm_head, shared))


def read_config_file(path: str | Path, cls):
    """A `T5Config` / `BertConfig` (`cls`) from a config.json file or a folder holding one."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise InputError(file, None, None, "config file not found")
    try:
        return cls.from_dict(json.loads(file.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as e:
        raise InputError(file, None, None, f"not a model config ({e})") from None


def infer_t5_config(state: Mapping[str, torch.Tensor], source: str) -> T5Config:
    """The T5 config of a T5 state dict (HF key layout), from its shapes.

    `shared.weight` (V, d), encoder/decoder block counts, heads and buckets from
    `encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight` (buckets, heads),
    d_kv from `q.weight` (heads·d_kv, d), d_ff from the feed-forward `wo.weight` (d, d_ff).
    Pad = decoder start = 0 and eos = 1, as in every T5 vocabulary.
    """
    vocab, d_model = _tensor(state, "shared.weight", source).shape
    bias = _tensor(state, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", source)
    buckets, heads = bias.shape
    inner = _tensor(state, "encoder.block.0.layer.0.SelfAttention.q.weight", source).shape[0]
    gated = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in state
    d_ff = _tensor(state, "encoder.block.0.layer.1.DenseReluDense.wo.weight", source).shape[1]
    layers = _count_blocks(state, "encoder.block.", source)
    decoder_layers = _count_blocks(state, "decoder.block.", source)
    if inner % heads:
        raise InputError(
            source,
            None,
            "encoder.block.0.layer.0.SelfAttention.q.weight",
            f"{inner} rows do not split into {heads} heads",
        )
    return T5Config(
        vocab_size=int(vocab),
        d_model=int(d_model),
        d_kv=inner // heads,
        d_ff=int(d_ff),
        num_heads=int(heads),
        num_layers=layers,
        num_decoder_layers=decoder_layers,
        relative_attention_num_buckets=int(buckets),
        feed_forward_proj="gated-gelu" if gated else "relu",
        tie_word_embeddings=not _own_lm_head(state),
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )


def infer_bert_config(
    state: Mapping[str, torch.Tensor], source: str, *, num_attention_heads: int | None = None
) -> BertConfig:
    """The BERT config of a Contriever state dict (HF BertModel keys, no `bert.` prefix).

    Heads are not visible in any shape: `num_attention_heads`, else hidden_size / 64.
    """
    vocab, hidden = _tensor(state, "embeddings.word_embeddings.weight", source).shape
    positions = _tensor(state, "embeddings.position_embeddings.weight", source).shape[0]
    types = _tensor(state, "embeddings.token_type_embeddings.weight", source).shape[0]
    intermediate = _tensor(state, "encoder.layer.0.intermediate.dense.weight", source).shape[0]
    layers = _count_blocks(state, "encoder.layer.", source)
    heads = num_attention_heads or max(int(hidden) // 64, 1)
    if hidden % heads:
        raise InputError(
            source,
            None,
            "embeddings.word_embeddings.weight",
            f"hidden size {hidden} does not split into {heads} attention heads",
        )
    return BertConfig(
        vocab_size=int(vocab),
        hidden_size=int(hidden),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=int(intermediate),
        max_position_embeddings=int(positions),
        type_vocab_size=int(types),
    )


def _load_checked(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str, what: str) -> None:
    """Load `state` into `model` (fp32) after checking every key and shape; InputError names the first fault."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise InputError(source, None, unexpected[0], f"unexpected tensor for a {what}{more}: unknown key layout")
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(source, None, missing[0], f"missing tensor of the {what}{more}")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise InputError(
                source, None, key, f"shape {tuple(tensor.shape)}, the {what} needs {tuple(expected[key].shape)}"
            )
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)


def t5_from_state_dict(
    state: Mapping[str, torch.Tensor], source: str, config: T5Config | None = None
) -> T5ForConditionalGeneration:
    """A `T5ForConditionalGeneration` (fp32, eval mode) holding the tensors of a T5 state dict.

    state: HF T5 keys (`shared.weight`, `encoder.block.{i}…`, `decoder.block.{i}…`, `lm_head.weight`,
    and from transformers < 4 `decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight`);
    config: None = inferred from the shapes (`infer_t5_config`). Missing aliases of `shared` are
    filled in; an `lm_head.weight` that differs from `shared` makes an `UntiedT5ForConditionalGeneration`
    (T5 v1.1 / lm-adapt, Atlas's readers); the cross-attention bias table is applied as the
    transformers that saved it applied it (`reader.cross_attention_bias.add_cross_attention_bias`).
    """
    state = dict(state)
    cross_bias = state.pop(CROSS_BIAS_KEY, None)
    config = config or infer_t5_config(state, source)
    shared = _tensor(state, "shared.weight", source)
    model = (UntiedT5ForConditionalGeneration if _own_lm_head(state) else T5ForConditionalGeneration)(config)
    expected = model.state_dict()
    for alias in (*_T5_ALIASES, "lm_head.weight"):
        if alias in expected and alias not in state:
            state[alias] = shared
        if alias in state and alias not in expected:
            state.pop(alias)
    _load_checked(model, state, source, "T5 reader")
    if cross_bias is not None:
        if not isinstance(cross_bias, torch.Tensor):
            raise InputError(source, None, CROSS_BIAS_KEY, f"expected a tensor, got {type(cross_bias).__name__}")
        try:
            add_cross_attention_bias(model, cross_bias.to(torch.float32))
        except ValueError as e:
            raise InputError(source, None, CROSS_BIAS_KEY, str(e).split(": ", 1)[-1]) from None
    return model.eval()


def bert_from_state_dict(state: Mapping[str, torch.Tensor], source: str, config: BertConfig | None = None) -> BertModel:
    """A `BertModel` without pooler (fp32, eval mode) holding a Contriever state dict's tensors.

    state: HF BertModel keys (`embeddings.…`, `encoder.layer.{i}.…`); config: None = inferred.
    """
    state = {k: v for k, v in state.items() if not _BERT_IGNORED.match(k)}
    config = config or infer_bert_config(state, source)
    model = BertModel(config, add_pooling_layer=False)
    _load_checked(model, state, source, "BERT retriever encoder")
    return model.eval()
