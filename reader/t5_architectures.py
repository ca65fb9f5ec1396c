"""The published T5 architectures the paper recipes name, built here with random weights.

`google/t5-{small,base,large,xl,xxl}-lm-adapt` are T5 v1.1 checkpoints trained 100k steps more as language models
(Lester et al., 2021); their architecture is T5 v1.1's (the `google/t5-v1_1-*` model cards and config.json files):
a gated-GELU feed-forward, an output projection (`lm_head`) of its own, learned relative position buckets (32
buckets up to distance 128, in the first self-attention layer of each stack; cross-attention has none), and a
32,128-row vocabulary (a 32,000-piece SentencePiece model, 100 sentinels, 28 unused rows). No weights can be had
here: `random_t5` builds the architecture with random weights (T5's own initialisation) for dry runs and tests, and
`write_random_t5` saves it with a tokenizer as a reader folder that `reader.model` can name. The sizes are in
`t5_architectures.json`, the layout every size shares in `T5_V1_1_LAYOUT`.

`head_dim` and `layers` make a narrower, shallower copy for tests: the same vocabulary, heads, relative position
buckets and untied output projection, so the same code paths run at a fraction of the cost.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, T5Config

from common.io import atomic_directory
from reader.t5_untied import UntiedT5ForConditionalGeneration

# hub name → the sizes of its published config.json
T5_ARCHITECTURES: dict[str, dict] = json.loads(Path(__file__).with_name("t5_architectures.json").read_text())
# What every T5 v1.1 / lm-adapt size shares (their config.json files; relative_attention_max_distance is absent
# from those older files and 128 is what T5 always used)
T5_V1_1_LAYOUT = {
    "vocab_size": 32128,
    "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6,
    "initializer_factor": 1.0,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}
# the T5 v1.1 checkpoints lm-adapt continued from have the same architecture
_V1_1_NAMES = {
    name.replace("google/t5-", "google/t5-v1_1-").removesuffix("-lm-adapt"): name for name in T5_ARCHITECTURES
}


def t5_architecture(name: str, *, head_dim: int | None = None, layers: int | None = None) -> dict:
    """`T5Config` keyword arguments of the published architecture `name` (a `google/t5-*-lm-adapt` or
    `google/t5-v1_1-*` hub name), narrowed or made shallower when asked.

    Args:
        head_dim: the head size (d_kv) of a narrower copy: the same heads (the relative position bias keeps its
            (32, heads) table), d_model and d_ff scaled by head_dim / 64 (t5-base at 4: d_model 48, d_ff 128).
        layers: encoder and decoder layers of a shallower copy; None keeps the published count.
    Raises ValueError for another name (listing the known ones).
    """
    sizes = T5_ARCHITECTURES.get(_V1_1_NAMES.get(name, name))
    if sizes is None:
        known = ", ".join([*T5_ARCHITECTURES, *_V1_1_NAMES])
        raise ValueError(f"no published T5 architecture named {name!r}; known: {known}")
    architecture = {**T5_V1_1_LAYOUT, **sizes}
    if head_dim is not None:
        if head_dim <= 0:
            raise ValueError(f"{name}: head_dim must be positive, not {head_dim}")
        ratio = head_dim / sizes["d_kv"]
        d_model, d_ff = (max(1, round(sizes[key] * ratio)) for key in ("d_model", "d_ff"))
        architecture.update(d_model=d_model, d_kv=head_dim, d_ff=d_ff)
    if layers is not None:
        if layers <= 0:
            raise ValueError(f"{name}: layers must be positive, not {layers}")
        architecture.update(num_layers=layers, num_decoder_layers=layers)
    return architecture


def random_t5(
    name: str, *, head_dim: int | None = None, layers: int | None = None, seed: int = 0
) -> UntiedT5ForConditionalGeneration:
    """The architecture `name` (`t5_architecture`) with random weights, T5's initialisation seeded by `seed`
    (the global random state is left as it was). Build it under `torch.device("meta")` to count parameters
    without allocating them."""
    config = T5Config(**t5_architecture(name, head_dim=head_dim, layers=layers))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return UntiedT5ForConditionalGeneration(config)


def write_random_t5(
    name: str,
    out: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    *,
    head_dim: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Write `random_t5(name, …)` and `tokenizer` to the reader folder `out` (config.json saying
    `tie_word_embeddings: false`, model.safetensors, the tokenizer's files), atomically; → `out`.

    `tokenizer` must fit the 32,128-row vocabulary (T5's 32,100 tokens do; `reader.tokenizer.train_t5_tokenizer`
    makes such a tokenizer) and follow T5's layout (`<pad>` 0, `</s>` 1).
    """
    architecture = t5_architecture(name, head_dim=head_dim, layers=layers)
    if len(tokenizer) > architecture["vocab_size"]:
        raise ValueError(
            f"{name}: a tokenizer of {len(tokenizer)} tokens does not fit its {architecture['vocab_size']} rows"
        )
    special = (tokenizer.pad_token_id, tokenizer.eos_token_id)
    if special != (architecture["pad_token_id"], architecture["eos_token_id"]):
        raise ValueError(f"{name}: the tokenizer's (pad, eos) ids are {special}, T5's are (0, 1)")
    model = random_t5(name, head_dim=head_dim, layers=layers, seed=seed)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
    return Path(out)
