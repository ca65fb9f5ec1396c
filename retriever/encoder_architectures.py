"""The published encoder architecture the paper recipes' retriever names, built here with random weights.

`retriever.model: contriever` is `facebook/contriever` (Izacard et al., 2022): BERT-base uncased (Devlin et al.,
2019; the `bert-base-uncased` config.json) read with mean pooling and no normalisation; `facebook/contriever-msmarco`
is the same architecture fine-tuned. No weights can be had here: `write_random_contriever` writes the architecture
with random weights (BERT's initialisation) and BERT-base's own 30,522-piece uncased WordPiece vocabulary — the one
the embedded all-MiniLM-L6-v2 ships — as an encoder folder that `retriever.model` can name, tied or untied. It has no
pooler (Contriever never reads it; the retriever loads BERT without one).

`head_dim` and `layers` make a narrower, shallower copy for tests: the same vocabulary, heads, positions and
pooling.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from common.io import atomic_directory
from common.modeling import CONTRIEVER_HUB_NAME, MINILM, encoder_source
from retriever.encoder import ContrieverEncoder

# BERT-base (uncased), the config.json of `bert-base-uncased`
BERT_BASE = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}
# hub name → (BertConfig keyword arguments, pooling)
ENCODER_ARCHITECTURES: dict[str, tuple[dict, str]] = {
    CONTRIEVER_HUB_NAME: (BERT_BASE, "mean"),
    "facebook/contriever-msmarco": (BERT_BASE, "mean"),
}


def encoder_architecture(name: str, *, head_dim: int | None = None, layers: int | None = None) -> dict:
    """`BertConfig` keyword arguments of the published encoder `name` (a hub name or "contriever"), narrowed or made
    shallower when asked.

    Args:
        head_dim: the head size of a narrower copy: the same heads, the hidden and feed-forward sizes scaled by
            head_dim / 64 (BERT-base at 4: hidden 48, feed-forward 192).
        layers: layers of a shallower copy; None keeps the published count.
    Raises ValueError for another name (listing the known ones).
    """
    found = ENCODER_ARCHITECTURES.get(encoder_source(name))
    if found is None:
        known = ", ".join(["contriever", *ENCODER_ARCHITECTURES])
        raise ValueError(f"no published encoder architecture named {name!r}; known: {known}")
    architecture = dict(found[0])
    if head_dim is not None:
        if head_dim <= 0:
            raise ValueError(f"{name}: head_dim must be positive, not {head_dim}")
        heads = architecture["num_attention_heads"]
        ratio = head_dim / (architecture["hidden_size"] // heads)
        feed_forward = max(1, round(architecture["intermediate_size"] * ratio))
        architecture.update(hidden_size=heads * head_dim, intermediate_size=feed_forward)
    if layers is not None:
        if layers <= 0:
            raise ValueError(f"{name}: layers must be positive, not {layers}")
        architecture["num_hidden_layers"] = layers
    return architecture


def random_contriever(
    name: str, *, head_dim: int | None = None, layers: int | None = None, seed: int = 0
) -> ContrieverEncoder:
    """The encoder `name` (`encoder_architecture`) with random weights seeded by `seed` (the global random state is
    left as it was), BERT-base's uncased WordPiece tokenizer and the published pooling."""
    config = BertConfig(**encoder_architecture(name, head_dim=head_dim, layers=layers))
    # all-MiniLM-L6-v2's tokenizer is bert-base-uncased's: the same 30,522 pieces, ids and lower-casing
    tokenizer = AutoTokenizer.from_pretrained(encoder_source(MINILM), model_max_length=config.max_position_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertModel(config, add_pooling_layer=False)
    pooling = ENCODER_ARCHITECTURES[encoder_source(name)][1]
    return ContrieverEncoder(model.eval(), tokenizer, pooling=pooling, normalize=False)


def write_random_contriever(
    name: str,
    out: str | Path,
    *,
    head_dim: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Write `random_contriever(name, …)` to the encoder folder `out` (config.json, model.safetensors, the tokenizer,
    `contriever_config.json` with the pooling), atomically; → `out`. `Retriever.from_pretrained(out, tied=…)` (or a
    recipe's `retriever.model`) loads it tied or untied."""
    encoder = random_contriever(name, head_dim=head_dim, layers=layers, seed=seed)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        encoder.save_pretrained(tmp)
    return Path(out)
