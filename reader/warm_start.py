"""A FiD reader whose encoder is a pre-trained BERT-family model and whose decoder is T5's.

No pre-trained T5 can be had offline, but pre-trained encoders can (all-MiniLM-L6-v2), and
FiD only needs per-passage encoder states and a decoder that cross-attends to them. So
`WarmStartedT5` is a `T5ForConditionalGeneration` whose encoder stack is replaced by a
Hugging Face encoder (`PretrainedEncoder`) and whose decoder is an ordinary T5 decoder stack.
Everything that reads a T5 reader — FiD fusion, generation, the cross-attention scores of
`adist`, the per-passage likelihoods of `pdist`/`emdr`/`loop` — works on it unchanged.

The encoder reads the reader tokenizer's ids (T5 layout over the encoder's WordPiece pieces):
its token embedding is the encoder's own, rows rearranged to the reader's ids
(`remap_token_embeddings`); the decoder shares it, so all three (retriever, reader encoder,
reader decoder) speak one vocabulary.

An optional copy head (`reader.copy_head.CopyHead`, a pointer-generator over the K·L input
tokens) makes answers that are spans of a passage a matter of "where", not "which of 30k words".

A folder written by `save_pretrained` holds config.json (the decoder's T5Config plus the
`atlas_reader` record: encoder class, config and base, copy head) and model.safetensors with
only the tensors that differ from the base encoder (frozen layers and token embeddings are
rebuilt from the installed base at load time, checked against a stored hash).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from common.modeling import BERT_FAMILY, encoder_source
from reader.attention_backend import with_training_attention
from reader.beam_attention import CACHE_KWARG, output_cache
from reader.copy_head import CopyHead, CopySource
from reader.inputs import IGNORE_INDEX

READER_KIND = "warm-started-fid"
WEIGHTS_FILE = "model.safetensors"

# Decoder presets over a pre-trained encoder; d_model is the encoder's hidden size.
WARM_START_PRESETS: dict[str, dict] = json.loads(Path(__file__).with_name("warm_start_presets.json").read_text())

# Reader special tokens → the encoder's own tokens with the same role. `<extra_id_0>` marks the
# blank to fill, which is what BERT's [MASK] meant in pre-training.
_SPECIAL_ROWS = {"<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]", "<extra_id_0>": "[MASK]"}


def remap_token_embeddings(
    source: torch.Tensor, source_vocab: dict[str, int], vocab: dict[str, int]
) -> tuple[torch.Tensor, int]:
    """The encoder's token embedding `source` (V_s, H) with rows rearranged to the reader's ids (`vocab`,
    the reader tokenizer's `get_vocab()`).

    Pieces both vocabularies share keep their row; the reader's specials take the row of the
    encoder token with the same role (`<pad>`→[PAD], `</s>`→[SEP], `<unk>`→[UNK],
    `<extra_id_0>`→[MASK], `<extra_id_i>`→[unused i-1]); any other reader token gets the mean row.
    Returns ((V_r, H) float tensor, number of rows copied from `source`).
    """
    rows = source.detach().new_empty(max(vocab.values()) + 1, source.shape[1])
    rows[:] = source.detach().mean(0)
    copied = 0
    for token, row in vocab.items():
        name = _SPECIAL_ROWS.get(token, token)
        if token.startswith("<extra_id_") and token not in _SPECIAL_ROWS:
            name = f"[unused{int(token[len('<extra_id_') : -1]) - 1}]"
        if name in source_vocab:
            rows[row] = source[source_vocab[name]]
            copied += 1
    return rows, copied


class PretrainedEncoder(nn.Module):
    """A Hugging Face encoder (BERT, MiniLM, RoBERTa, …) as the encoder stack of a T5 model.

    Args:
        model: the encoder (its token embedding already in the reader's id order).
        d_model: the decoder's width; a linear map is added when it differs from the encoder's.
    """

    main_input_name = "input_ids"  # read by `generate`

    def __init__(self, model: nn.Module, d_model: int) -> None:
        super().__init__()
        self.model = model
        hidden = model.config.hidden_size
        self.project = nn.Identity() if hidden == d_model else nn.Linear(hidden, d_model, bias=False)

    @property
    def layers(self) -> nn.ModuleList:
        """The encoder's transformer blocks, bottom first."""
        return self.model.encoder.layer

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, embeddings: nn.Embedding) -> None:
        self.model.set_input_embeddings(embeddings)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **_: object,
    ) -> BaseModelOutput:
        """(N, L) ids and mask → BaseModelOutput with `last_hidden_state` (N, L, d_model).

        Rows with no real token (FiD's padding passages) attend to their first position, so that
        no attention row is empty (NaN under some kernels); the decoder masks them out anyway.
        """
        if attention_mask is not None:
            empty = attention_mask.sum(-1) == 0
            if empty.any():
                attention_mask = attention_mask.clone()
                attention_mask[empty, 0] = 1
        states = self.model(
            input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds
        ).last_hidden_state
        return BaseModelOutput(last_hidden_state=self.project(states))


class WarmStartedT5(T5ForConditionalGeneration):
    """T5 with a pre-trained encoder in place of its encoder stack (and an optional copy head).

    Args:
        config: the decoder's T5Config; `config.atlas_reader` records the encoder and the head.
        encoder: the `PretrainedEncoder` (its embedding becomes the decoder's `shared`).
    """

    _tied_weights_keys: ClassVar[dict[str, str]] = {
        "decoder.embed_tokens.weight": "shared.weight",
        "lm_head.weight": "shared.weight",
    }

    def __init__(self, config: T5Config, encoder: PretrainedEncoder) -> None:
        config.num_layers = 0  # the T5 encoder stack is replaced below
        super().__init__(config)
        self.encoder = encoder
        self.tie_embeddings()
        self.copy_head = CopyHead(config.d_model) if config.atlas_reader["copy"] else None

    @property
    def copies_from_source(self) -> bool:
        """Whether `forward` needs `source_ids` (the copy head points into the input tokens)."""
        return self.copy_head is not None

    def set_trainable_encoder_layers(self, n: int | None) -> None:
        """Train only the top `n` encoder blocks (None: the whole encoder). The token embedding
        (shared with the decoder) is frozen whenever `n` is set."""
        self.encoder.requires_grad_(True)
        self.shared.requires_grad_(True)
        if n is None:
            return
        layers = self.encoder.layers
        if not 0 <= n <= len(layers):
            raise ValueError(f"reader.trainable_encoder_layers={n}: the encoder has {len(layers)} layers")
        self.encoder.model.embeddings.requires_grad_(False)
        self.shared.requires_grad_(False)
        for layer in list(layers)[: len(layers) - n]:
            layer.requires_grad_(False)

    @with_training_attention  # no cuDNN attention in a pass that takes gradients (reader.attention_backend)
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        past_key_values=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        labels=None,
        use_cache=None,
        source_ids: torch.Tensor | None = None,
        passage_length: int | None = None,
        source_previous_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """T5's forward; with the copy head, `logits` are the mixed log-probabilities.

        Args beyond T5's: source_ids (B, S) the ids of the S fused encoder positions (needed by
        the copy head; default: `input_ids` when the encoder runs here); passage_length: L of
        the fused S = K·L positions (default: S, one passage); source_previous_ids (B, S): the id
        before each position in its passage (`reader.copy_head.previous_source_ids`), for positions
        that are not K blocks of L (`FiDReader.generate` packs the passages' real tokens). In beam
        search, a `BeamSharedCrossAttentionCache` holding the examples' `copy_source` lets the copy head
        read one copy of each example's passages for all its beams.
        """
        # long: T5ForConditionalGeneration.forward's contract, argument by argument, for a decoder over a BERT-family
        # encoder
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds
            )
            source_ids = input_ids if source_ids is None else source_ids
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
        encoder_states = encoder_outputs.last_hidden_state
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = self._shift_right(labels)
        if past_key_values is not None:  # the cache's name before transformers 5.24 (5.24 passes `cache` in kwargs)
            kwargs["past_key_values"] = past_key_values
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            inputs_embeds=decoder_inputs_embeds,
            encoder_hidden_states=encoder_states,
            encoder_attention_mask=attention_mask,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        states = decoder_outputs.last_hidden_state  # (B, T, D), after the final norm
        logits = self.lm_head(states * (self.model_dim**-0.5) if self.config.scale_decoder_outputs else states)
        if self.copy_head is not None:
            source = getattr(kwargs.get(CACHE_KWARG), "copy_source", None)
            if source is None:
                if source_ids is None:
                    raise ValueError("this reader has a copy head: pass source_ids (the encoder input ids)")
                mask = attention_mask if attention_mask is not None else torch.ones_like(source_ids)
                source = CopySource(encoder_states, mask, source_ids, source_previous_ids)
            logits = self.copy_head(
                states,
                logits,
                source.states,
                source.mask,
                source.ids,
                decoder_input_ids=decoder_input_ids,
                passage_length=passage_length,
                previous_ids=source.previous_ids,
                log_prior=source.log_prior,
            )
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX
            )
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_KWARG: output_cache(decoder_outputs)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_states,
        )

    # --- persistence ----------------------------------------------------------------------
    def save_pretrained(
        self,
        save_directory,
        state_dict: dict[str, torch.Tensor] | None = None,
        dtype: torch.dtype | None = None,
        **_: object,
    ) -> None:
        """Write config.json and model.safetensors with only the tensors that differ from the base
        encoder (plus the hash of the base tensors left out). `state_dict`: the full weights when
        the module holds a partition (DeepSpeed ZeRO-3); `dtype`: e.g. torch.float16 to ship."""
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        weights = dict(state_dict) if state_dict is not None else self.state_dict()
        weights.pop("lm_head.weight", None)  # tied to shared
        weights.pop("decoder.embed_tokens.weight", None)
        word_embeddings = weights.get("encoder.model.embeddings.word_embeddings.weight")
        shared = weights.get("shared.weight")
        if word_embeddings is not None and shared is not None and shared.data_ptr() == word_embeddings.data_ptr():
            # one tensor under two names (safetensors refuses to write it twice): `from_folder` ties it back
            weights.pop("shared.weight")
        base = _base_encoder_state(self.config.atlas_reader, self.config.vocab_size)
        omitted = sorted(
            name
            for name, tensor in weights.items()
            if name in base
            and tensor.shape == base[name].shape
            and torch.equal(tensor.detach().cpu().float(), base[name].float())
        )
        kept = {
            name: t.detach().cpu().to(dtype or t.dtype).contiguous()
            for name, t in weights.items()
            if name not in omitted
        }
        config = self.config.to_dict()
        config["num_layers"] = 0
        config["atlas_reader"] = {
            **self.config.atlas_reader,
            "from_base": omitted,
            "base_sha256": _tensor_hash({n: base[n] for n in omitted}),
        }
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(kept, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})

    @classmethod
    def from_folder(cls, folder: str | Path, dropout: float | None = None) -> WarmStartedT5:
        """Load a folder written by `save_pretrained` (fp32 weights whatever the folder stores)."""
        folder = Path(folder)
        record = json.loads((folder / "config.json").read_text())
        info = record.pop("atlas_reader")
        from_base, expected_hash = info.pop("from_base", []), info.pop("base_sha256", None)
        config = T5Config(**{k: v for k, v in record.items() if k not in ("architectures", "transformers_version")})
        if dropout is not None:
            config.dropout_rate = dropout
            info["encoder_config"].update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        config.atlas_reader = info
        base = _base_encoder_state(info, config.vocab_size)
        if expected_hash is not None and _tensor_hash({n: base[n] for n in from_base}) != expected_hash:
            raise ValueError(
                f"{folder}: the base encoder {info['encoder']!r} installed here differs from the one "
                "this reader was trained on (hash of its frozen tensors); install that version"
            )
        model = cls(config, _build_encoder(info, config.d_model, config.vocab_size))
        weights = load_file(str(folder / WEIGHTS_FILE))
        for name in from_base:
            weights[name] = base[name]
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
        # a folder saved before the span-continuation bias existed reads as β = 0 (its behaviour then)
        missing = [
            m
            for m in missing
            if m not in ("lm_head.weight", "decoder.embed_tokens.weight", "copy_head.continuation", "shared.weight")
        ]
        if missing or unexpected:
            raise ValueError(f"{folder}/{WEIGHTS_FILE}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
        model.tie_embeddings()
        return model

    def tie_embeddings(self) -> None:
        """Point the decoder's embedding and the output layer at the encoder's token embedding."""
        embeddings = self.encoder.get_input_embeddings()
        if embeddings.weight.shape == self.shared.weight.shape:
            self.shared = embeddings
            self.decoder.set_input_embeddings(embeddings)
            self.lm_head.weight = embeddings.weight


def _tensor_hash(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().cpu().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _build_encoder(info: dict, d_model: int, vocab_size: int) -> PretrainedEncoder:
    """The encoder module with the recorded config; weights random (callers load them)."""
    encoder_config = AutoConfig.for_model(**info["encoder_config"])
    encoder_config.vocab_size = vocab_size
    kwargs = {"add_pooling_layer": False} if encoder_config.model_type in BERT_FAMILY else {}
    model = AutoModel.from_config(encoder_config, **kwargs)
    return PretrainedEncoder(model, d_model)


def _load_base(source: str) -> nn.Module:
    """The pre-trained encoder in fp32, without the pooler FiD has no use for."""
    kwargs = {"add_pooling_layer": False} if AutoConfig.from_pretrained(source).model_type in BERT_FAMILY else {}
    return AutoModel.from_pretrained(source, dtype=torch.float32, **kwargs)


def _base_encoder_state(info: dict, vocab_size: int) -> dict[str, torch.Tensor]:
    """The base encoder's weights as this reader's `encoder.*` tensors (embedding remapped to the
    reader's ids), from the installed base named in `info["encoder"]`."""
    source = encoder_source(info["encoder"])
    model = _load_base(source)
    vocab = AutoTokenizer.from_pretrained(source).get_vocab()
    rows, _ = remap_token_embeddings(model.get_input_embeddings().weight, vocab, info["reader_vocab"])
    if rows.shape[0] != vocab_size:
        raise ValueError(f"reader vocabulary of {vocab_size} tokens, but the recorded one has {rows.shape[0]}")
    state = {f"encoder.model.{k}": v for k, v in model.state_dict().items() if not k.startswith("pooler.")}
    state["encoder.model.embeddings.word_embeddings.weight"] = rows
    state["shared.weight"] = rows
    return state


def build_warm_started(
    preset: str | dict,
    tokenizer: PreTrainedTokenizerBase,
    *,
    encoder: str | None = None,
    dropout: float | None = None,
    seed: int | None = None,
) -> WarmStartedT5:
    """A new reader: the pre-trained encoder (`encoder` or the preset's, e.g. "minilm") under a
    randomly initialised T5 decoder of the preset's size (a name in WARM_START_PRESETS or a dict).

    The reader's token embedding (shared by encoder, decoder and output layer) is the encoder's,
    rows rearranged to `tokenizer`'s ids. `dropout` (default 0.1) applies to both stacks.
    """
    if isinstance(preset, str):
        if preset not in WARM_START_PRESETS:
            raise ValueError(f"unknown warm-start preset {preset!r}; valid: {sorted(WARM_START_PRESETS)}")
        preset = WARM_START_PRESETS[preset]
    spec = dict(preset)
    encoder_name = encoder or spec.pop("encoder")
    spec.pop("encoder", None)
    copy = spec.pop("copy", True)
    source = encoder_source(encoder_name)
    if seed is not None:
        torch.manual_seed(seed)
    base = _load_base(source)
    rate = 0.1 if dropout is None else dropout
    encoder_config = base.config.to_dict()
    encoder_config.update(hidden_dropout_prob=rate, attention_probs_dropout_prob=rate)
    for key in ("architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        encoder_config.pop(key, None)
    vocab = tokenizer.get_vocab()
    info = {
        "kind": READER_KIND,
        "encoder": encoder_name,
        "encoder_config": encoder_config,
        "copy": copy,
        "reader_vocab": vocab,
    }
    d_model = base.config.hidden_size
    config = T5Config(
        vocab_size=len(vocab),
        d_model=d_model,
        num_layers=0,
        dropout_rate=rate,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        **spec,
    )
    config.atlas_reader = info
    model = WarmStartedT5(config, _build_encoder(info, d_model, len(vocab)))
    state = _base_encoder_state(info, len(vocab))
    model.load_state_dict({k: v for k, v in state.items() if k != "shared.weight"}, strict=False)
    model.tie_embeddings()
    return model


def is_warm_started_folder(folder: str | Path) -> bool:
    """True for a folder written by `WarmStartedT5.save_pretrained`."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("atlas_reader", {}).get("kind") == READER_KIND
    except (json.JSONDecodeError, AttributeError):
        return False
