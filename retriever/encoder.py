"""The Contriever encoder: a BERT-style Hugging Face model + pooling over non-padding tokens.

`ContrieverEncoder` loads any local Hugging Face folder (or a sentence-transformers folder,
whose pooling and normalisation settings it reads), encodes with gradients through
`forward`, and embeds large text lists under `torch.inference_mode` through
`embed_texts`, with batches formed from length-sorted texts so little padding is computed.
`Retriever` pairs a query and a passage encoder (tied or untied).

One meaning per verb, on both classes: `encode…` runs with gradients (as the module's train/eval mode
says) and returns a torch tensor; `embed…` runs under no-grad in eval mode and returns a numpy array.

Embedding runs at one of `retriever.embedding_precision.EMBEDDING_PRECISIONS` (`precision=` on `embed_texts` and
the `Retriever`'s `embed_…`, `Retriever.precision`, the commands' `--precision`): fp32, bf16 (autocast) or auto
(bf16 where the hardware multiplies it natively, the default).

`layer_norm="reference"` makes an encoder compute what facebookresearch/atlas's retriever computed:
its `src/modeling_bert.py` normalises by the raw second moment instead of the variance
(`ReferenceLayerNorm`); checkpoints imported from it are saved with that setting.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer

from common.modeling import BERT_FAMILY, eval_mode
from common.progress import progress_bar as tqdm
from retriever.embedding_precision import (
    DEFAULT_EMBEDDING_PRECISION,
    embedding_autocast,
    resolve_embedding_precision,
)
from retriever.fingerprint import hash_state_dict, hash_tokenizer

Pooling = Literal["mean", "cls"]
POOLINGS = ("mean", "cls")
LayerNormKind = Literal["standard", "reference"]
LAYER_NORMS = ("standard", "reference")
ENCODER_CONFIG = "contriever_config.json"
RETRIEVER_CONFIG = "retriever.json"

logger = logging.getLogger(__name__)


def _read_sentence_transformers_settings(path: Path) -> dict:
    """Pooling / normalisation / max length from a sentence-transformers folder, if it is one."""
    settings: dict = {}
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return settings
    modules = json.loads(modules_file.read_text())
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith("Normalize"):
            settings["normalize"] = True
        if kind.endswith("Pooling"):
            pooling_config = json.loads((path / module["path"] / "config.json").read_text())
            if pooling_config.get("pooling_mode_cls_token"):
                settings["pooling"] = "cls"
            elif pooling_config.get("pooling_mode_mean_tokens"):
                settings["pooling"] = "mean"
            else:
                modes = [k for k, v in pooling_config.items() if k.startswith("pooling_mode") and v]
                raise ValueError(f"{path}: pooling {modes} is not supported; valid: {', '.join(POOLINGS)}")
    bert_config = path / "sentence_bert_config.json"
    if bert_config.is_file():
        settings["max_length"] = json.loads(bert_config.read_text()).get("max_seq_length")
    return settings


class ReferenceLayerNorm(nn.LayerNorm):
    """The layer norm of facebookresearch/atlas's BERT (`BertLayerNorm` in its src/modeling_bert.py),
    used in the embeddings, the attention outputs and the layer outputs of every Contriever it trained:

        y = w ⊙ (x − mean(x)) / sqrt(mean(x²) + eps) + b

    over the last axis — the raw second moment, not the variance (mean((x − mean(x))²)) of
    `nn.LayerNorm`; eps is the BERT config's `layer_norm_eps`, as the reference passes it. Computed
    in float32 (as the reference does) and returned in the input's dtype. Same parameters and
    state-dict keys as `nn.LayerNorm`.
    """

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(…, d) → (…, d)."""
        x = hidden_states.float()
        centred = x - x.mean(-1, keepdim=True)
        second_moment = x.pow(2).mean(-1, keepdim=True)
        normed = centred * torch.rsqrt(second_moment + self.eps)
        return (self.weight.float() * normed + self.bias.float()).to(hidden_states.dtype)


def use_layer_norm(model: nn.Module, kind: LayerNormKind) -> None:
    """Make every layer norm of `model` a standard `nn.LayerNorm` or a `ReferenceLayerNorm` (in place).

    The new modules hold the old ones' parameters (the same `nn.Parameter` objects), so the state
    dict, an optimizer's references and tied weights are unchanged.
    """
    if kind not in LAYER_NORMS:
        raise ValueError(f"unknown layer_norm {kind!r}; valid: {', '.join(LAYER_NORMS)}")
    target = ReferenceLayerNorm if kind == "reference" else nn.LayerNorm
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) not in (nn.LayerNorm, ReferenceLayerNorm):
                continue
            if child.weight is None or child.bias is None:
                raise ValueError(f"layer norm {name!r} has no weight or bias; the reference's has both")
            if type(child) is not target:
                replacement = target(
                    child.normalized_shape, eps=child.eps, device=child.weight.device, dtype=child.weight.dtype
                )
                replacement.weight, replacement.bias = child.weight, child.bias
                replacement.train(child.training)
                setattr(module, name, replacement)
            swapped += 1
    if swapped == 0:
        raise ValueError(f"{type(model).__name__} has no nn.LayerNorm to make {kind!r}")


class ContrieverEncoder(nn.Module):
    """A Hugging Face encoder whose pooled last hidden state embeds a text.

    pooling: "mean" (over non-padding tokens, Contriever's) or "cls" (first token).
    normalize: L2-normalise the pooled vector (sentence-transformers models such as
    all-MiniLM-L6-v2 are trained that way).
    layer_norm: "standard" (`nn.LayerNorm`, every Hugging Face model's) or "reference" (the
    second-moment norm of facebookresearch/atlas's retriever, `ReferenceLayerNorm`: for
    checkpoints trained by it). Saved with the encoder.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        pooling: Pooling = "mean",
        normalize: bool = False,
        max_length: int | None = None,
        layer_norm: LayerNormKind = "standard",
    ):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; valid: {', '.join(POOLINGS)}")
        if layer_norm != "standard":
            use_layer_norm(model, layer_norm)  # (which refuses an unknown kind)
        self.model = model
        self.tokenizer = tokenizer
        self.pooling: Pooling = pooling
        self.normalize = normalize
        self.max_length = max_length
        self.layer_norm: LayerNormKind = layer_norm
        self.train(model.training)  # HF loads in eval mode; a fresh wrapper must not re-enable dropout

    @property
    def dim(self) -> int:
        """The embedding dimension d."""
        return int(self.model.config.hidden_size)

    @property
    def device(self) -> torch.device:
        """Where the weights live (inputs are moved there)."""
        return next(self.model.parameters()).device

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        pooling: Pooling | None = None,
        normalize: bool | None = None,
    ) -> ContrieverEncoder:
        """Load from a Hugging Face folder, a sentence-transformers folder, or a hub name.

        Settings are taken, in order, from the arguments, from `contriever_config.json`
        (written by `save_pretrained`; it also records the layer norm), from the
        sentence-transformers modules, else mean pooling without normalisation.
        """
        folder = Path(path)
        settings: dict = {}
        if folder.is_dir():
            settings.update(_read_sentence_transformers_settings(folder))
            if (folder / ENCODER_CONFIG).is_file():
                settings.update(json.loads((folder / ENCODER_CONFIG).read_text()))
        if pooling is not None:
            if pooling not in POOLINGS:
                raise ValueError(f"unknown pooling {pooling!r}; valid: {', '.join(POOLINGS)}")
            if settings.get("pooling", pooling) != pooling:
                logger.warning(
                    "%s was saved with %s pooling; using %s pooling as asked (its embeddings "
                    "will differ from the ones it was trained to give)",
                    path,
                    settings["pooling"],
                    pooling,
                )
            settings["pooling"] = pooling
        if normalize is not None:
            settings["normalize"] = normalize
        model = (
            AutoModel.from_pretrained(str(path), add_pooling_layer=False)
            if _is_bert_like(path)
            else AutoModel.from_pretrained(str(path))
        )
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        return cls(
            model,
            tokenizer,
            pooling=settings.get("pooling", "mean"),
            normalize=bool(settings.get("normalize", False)),
            max_length=settings.get("max_length"),
            layer_norm=settings.get("layer_norm", "standard"),
        )

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write weights (safetensors), tokenizer and pooling settings to `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        settings = {
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_length": self.max_length,
            "layer_norm": self.layer_norm,
        }
        (directory / ENCODER_CONFIG).write_text(json.dumps(settings, indent=2) + "\n")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Embed a padded batch: (B, L) ids and mask → (B, d) pooled embeddings."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, d)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, p=2, dim=-1)
        return pooled

    def tokenize(self, texts: Sequence[str], max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Tokenize and pad `texts` into (B, L) `input_ids` / `attention_mask` on the encoder's device."""
        batch = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=max_length or self.max_length or 512,
            return_tensors="pt",
        )
        return {
            "input_ids": batch["input_ids"].to(self.device),
            "attention_mask": batch["attention_mask"].to(self.device),
        }

    def encode(self, texts: Sequence[str], max_length: int | None = None) -> torch.Tensor:
        """Encode texts with gradients (respects train/eval mode): → (B, d) tensor."""
        return self(**self.tokenize(texts, max_length))

    def token_lengths(self, texts: Sequence[str], max_length: int | None = None) -> np.ndarray:
        """(N,) int64: the tokens each text is embedded with (truncated at `max_length`, as `embed_texts` truncates):
        what `embed_texts` sorts its batches by."""
        if len(texts) == 0:
            return np.zeros(0, dtype=np.int64)
        encoded = self.tokenizer(list(texts), truncation=True, max_length=max_length or self.max_length or 512)
        return np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)

    def embed_texts(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 64,
        max_length: int | None = None,
        progress: bool = False,
        sort_by_length: bool = True,
        precision: str = DEFAULT_EMBEDDING_PRECISION,
    ) -> np.ndarray:
        """Embed many texts for indexing: → (N, d) float32, in the order of `texts`.

        Runs under `torch.inference_mode` in eval mode. Texts are tokenized once, sorted by
        token length and batched in that order, so each batch pads to nearly its own length
        (`sort_by_length=False` gives the naive order, for benchmarks). `precision`: one of
        `EMBEDDING_PRECISIONS` (`resolve_embedding_precision`); the vectors are float32 either way.
        """
        resolved = resolve_embedding_precision(precision, self.device)
        max_length = max_length or self.max_length or 512
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        encoded = self.tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
        lengths = np.array([len(ids) for ids in encoded])
        order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(len(texts))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        pad_id = self.tokenizer.pad_token_id or 0
        with eval_mode(self), torch.inference_mode(), embedding_autocast(resolved, self.device):
            for start in tqdm(range(0, len(texts), batch_size), disable=not progress, desc="encode", unit="batch"):
                rows = order[start : start + batch_size]
                width = int(lengths[rows].max())
                ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for i, row in enumerate(rows):
                    ids[i, : lengths[row]] = torch.tensor(encoded[row])
                    mask[i, : lengths[row]] = 1
                pooled = self(ids.to(self.device), mask.to(self.device))
                out[rows] = pooled.float().cpu().numpy()
        return out

    def fingerprint(self) -> dict[str, str]:
        """Content hashes of what determines the embeddings: weights, tokenizer, pooling, layer norm."""
        fingerprint = {
            "weights": hash_state_dict(self.model.state_dict()),
            "tokenizer": hash_tokenizer(self.tokenizer),
            "pooling": self.pooling,
            "normalize": str(self.normalize),
        }
        if self.layer_norm != "standard":  # absent for the standard norm: indexes built before it existed stay valid
            fingerprint["layer_norm"] = self.layer_norm
        return fingerprint


def _is_bert_like(path: str | os.PathLike) -> bool:
    """BERT models carry an unused pooler; loading without it avoids a spurious warning."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return False
    return json.loads(config_file.read_text()).get("model_type") in BERT_FAMILY
