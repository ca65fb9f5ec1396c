"""Fusion-in-Decoder reader over Hugging Face `T5ForConditionalGeneration`.

Each (query, passage) pair is encoded independently, the K encoder outputs are concatenated
along the sequence axis and the decoder cross-attends to all of them (Izacard & Grave, 2021).
Shapes are passed explicitly: nothing is stored on the T5 config between calls, so one
reader can serve batches with different K.

Notation: B examples, K passages each, L tokens per passage, H = d_model, T target tokens.
Target ids use -100 at ignored (padding) positions, as Hugging Face losses do.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoModel,
    AutoTokenizer,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from common.io import atomic_directory
from common.modeling import encoder_source, is_hub_id, missing_folder
from reader import attention_scores, passage_scores
from reader.attention_backend import checkpoint_contexts, with_training_attention
from reader.beam_attention import (
    CACHE_KWARG,
    BeamSharedCrossAttentionCache,
    fold_beams_in_cross_attention,
)
from reader.copy_head import CopySource, previous_source_ids
from reader.cross_attention_bias import CONFIG_FLAG as CROSS_BIAS_FLAG
from reader.cross_attention_bias import has_cross_attention_bias, load_cross_attention_bias
from reader.embedding_init import transfer_token_embeddings
from reader.encoder_precision import precision_autocast, resolve_precision
from reader.inputs import IGNORE_INDEX  # noqa: F401  (re-exported: atlas imports it from reader.fid)
from reader.int8_decoding import Int8Decoding, answering_plan, partitioned
from reader.reader_config import ReaderConfig
from reader.span_constraint import DeviceSpanConstraint, PassageSpanConstraint, StepPrefixConstraint
from reader.t5_untied import UntiedT5ForConditionalGeneration, saved_untied
from reader.warm_start import (
    WARM_START_PRESETS,
    WarmStartedT5,
    build_warm_started,
    is_warm_started_folder,
)

logger = logging.getLogger(__name__)

# most rows the encoder takes at once: enough for efficient matrix products, few enough that a
# group's rows have similar lengths
ENCODE_GROUP_ROWS = 16
# a group ends before its padding would exceed this share of its real tokens: each row is encoded at
# close to its own length, whatever the lengths of the rows read beside it
ENCODE_GROUP_PADDING = 0.125


# Presets built from config (no pretrained T5 exists offline). Sizes follow the T5 papers;
# `t5-tiny` / `t5-mini` are for tests and laptops; `t5-v1_1-small` is the T5 v1.1 / lm-adapt layout
# (gated-GELU feed-forward, untied output embedding).
READER_PRESETS: dict[str, dict] = json.loads(Path(__file__).with_name("t5_presets.json").read_text())


def _module_dropout(module: nn.Module) -> float:
    """The dropout rate a module applies itself: an nn.Dropout's p, or an attention module's float
    `dropout` rate (T5Attention); 0 for anything else."""
    if isinstance(module, nn.Dropout):
        return module.p
    rate = getattr(module, "dropout", None)
    return rate if isinstance(rate, float) else 0.0


class FiDReader(nn.Module):
    """A T5 encoder-decoder read as Fusion-in-Decoder.

    Args:
        seq2seq: the wrapped encoder-decoder: a `T5ForConditionalGeneration` (any T5 / v1.1 /
            lm-adapt config), or a T5 decoder over a BERT-family encoder (`reader.warm_start`, the
            shipped reader's MiniLM encoder).
    """

    def __init__(self, seq2seq: T5ForConditionalGeneration) -> None:
        super().__init__()
        self.seq2seq = seq2seq
        fold_beams_in_cross_attention(seq2seq)  # beam search reads each example's passages once
        self.int8_decoding = Int8Decoding()  # the decoder's int8 copies, made at the first int8 answer

    @property
    def config(self) -> T5Config:
        """The wrapped model's config (read-only use; FiD keeps no state there)."""
        return self.seq2seq.config

    @property
    def copies_from_source(self) -> bool:
        """Whether the decoder points into the input tokens (a copy head), so that every decoder
        pass needs the encoder input ids (`source_kwargs`)."""
        return bool(getattr(self.seq2seq, "copies_from_source", False))

    def source_kwargs(self, input_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Extra decoder-pass arguments: `{"source_ids": (B, K·L), "passage_length": L}` for a copy
        head, else `{}`.

        Args:
            input_ids: (B, K, L) the encoder input ids (None only for readers without a copy head).
        """
        if not self.copies_from_source:
            return {}
        if input_ids is None:
            raise ValueError("this reader copies from its input (copy head): pass input_ids with encoder_states")
        return {"source_ids": input_ids.reshape(input_ids.shape[0], -1), "passage_length": input_ids.shape[-1]}

    def encoder_is_dropout_free(self) -> bool:
        """True when the encoder applies no dropout in train mode, so that its training-pass states
        are the eval-mode states (the retriever losses' gold scores can reuse them)."""
        return all(_module_dropout(m) == 0 for m in self.seq2seq.encoder.modules())

    def disable_encoder_dropout(self) -> None:
        """No dropout in the encoder (its layers, attention probabilities and embeddings); the decoder
        keeps its rate. Runtime only: a saved reader keeps its config's `dropout_rate`."""
        for module in self.seq2seq.encoder.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
            elif isinstance(getattr(module, "dropout", None), float):  # T5Attention: a rate, not a module
                module.dropout = 0.0

    # --- encoding ---------------------------------------------------------------------
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
        """Encode every passage independently.

        The B·K rows are encoded in groups of similar length (`length_groups`), each cut to its own
        longest row: a batch pads every row to its longest passage, and the encoder would otherwise pay
        for that padding on every row. Positions after a row's last real token are masked everywhere downstream, so
        their states (zero, or computed under the mask) never matter.

        Args:
            input_ids: (B, K, L) token ids of the formatted (query, passage) pairs.
            attention_mask: (B, K, L), 1 for real tokens.
            precision: "fp32" (the encoder's own precision), "bf16" (bfloat16 autocast:
                `reader.encoder_precision`) or "auto" (bf16 for a no-grad pass where the hardware
                multiplies bfloat16 natively, else fp32).
        Returns:
            (B, K, L, H) encoder states in the encoder's dtype (with gradient when grad is enabled).
        """
        if precision == "auto" and torch.is_grad_enabled():
            precision = "fp32"
        precision = resolve_precision(precision, self.seq2seq.encoder)
        state_dtype = next(self.seq2seq.encoder.parameters()).dtype
        batch, n_passages, length = input_ids.shape
        ids = input_ids.reshape(batch * n_passages, length)
        mask = attention_mask.reshape(batch * n_passages, length)
        # a row's length: one past its last real token (at least 1, so a fully masked row stays a row)
        positions = torch.arange(1, length + 1, device=mask.device)
        lengths = (mask.ne(0) * positions).amax(dim=-1).clamp(min=1)  # (B·K,)
        order = torch.argsort(lengths, descending=True, stable=True)
        groups = []
        for rows in order.split(length_groups(lengths[order].tolist())):
            used = int(lengths[rows[0]])  # the longest of the group: rows are sorted
            with precision_autocast(precision, ids.device):
                group = self.seq2seq.encoder(
                    input_ids=ids[rows, :used], attention_mask=mask[rows, :used]
                ).last_hidden_state
            group = group.to(state_dtype)  # autocast leaves bfloat16 states
            groups.append(nn.functional.pad(group, (0, 0, 0, length - used)))  # (rows, L, H)
        states = torch.cat(groups)[torch.argsort(order)]  # back to the input's row order
        return states.view(batch, n_passages, length, -1)

    @staticmethod
    def fuse(encoder_states: torch.Tensor, attention_mask: torch.Tensor) -> tuple[BaseModelOutput, torch.Tensor]:
        """Concatenate passages: (B, K, L, H) states and (B, K, L) mask → (B, K·L, H), (B, K·L)."""
        batch, n_passages, length, hidden = encoder_states.shape
        fused = encoder_states.reshape(batch, n_passages * length, hidden)
        return BaseModelOutput(last_hidden_state=fused), attention_mask.reshape(batch, n_passages * length)

    @staticmethod
    def fuse_packed(
        encoder_states: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[BaseModelOutput, torch.Tensor, torch.Tensor]:
        """Concatenate only the real tokens of each example's passages, in order: (B, K, L, H) states and
        (B, K, L) mask → (B, S, H) states, (B, S) mask and (B, S) positions in the K·L layout they came
        from, with S the most real tokens of any example (zero states and mask after an example's own).

        T5's cross-attention has no position bias and a softmax is blind to the order of its keys, so a
        decoder reading the packed layout gives the answers it gives over `fuse`'s, without the padding
        (a K=5 batch of SQuAD paragraphs is ~40% padding), which generation reads at every step.
        """
        batch, n_passages, length, hidden = encoder_states.shape
        real = attention_mask.reshape(batch, n_passages * length).ne(0)
        counts = real.sum(-1)
        width = max(int(counts.max()), 1)
        # a stable sort of "is padding" puts each example's real positions first, in their order
        positions = torch.argsort((~real).to(torch.int8), dim=-1, stable=True)[:, :width]  # (B, S)
        mask = torch.arange(width, device=counts.device) < counts.unsqueeze(-1)  # (B, S)
        states = encoder_states.reshape(batch, n_passages * length, hidden)
        packed = states.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden))
        packed = packed.masked_fill(~mask.unsqueeze(-1), 0.0)
        return BaseModelOutput(last_hidden_state=packed), mask.to(attention_mask.dtype), positions

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Decoder inputs for targets `labels` (B, T): start token prepended, -100 → pad."""
        return self.seq2seq._shift_right(labels)

    # --- training / scoring -----------------------------------------------------------
    @with_training_attention  # no cuDNN attention in a pass that takes gradients (reader.attention_backend)
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        encoder_states: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> Seq2SeqLMOutput:
        """Read K passages per example and decode.

        Args:
            input_ids: (B, K, L); may be None when `encoder_states` is given (except for a
                reader with a copy head, which points into these ids).
            attention_mask: (B, K, L).
            labels: (B, T) target ids, -100 where ignored; gives `.loss` (mean token CE).
            decoder_input_ids: (B, T) explicit decoder inputs (default: labels shifted right).
            encoder_states: (B, K, L, H) states from `encode`, reused instead of re-encoding.
            output_hidden_states: also return `decoder_hidden_states` (each (B, T, H)).
        Returns:
            `Seq2SeqLMOutput` with `loss`, `logits` (B, T, V) and
            `encoder_last_hidden_state` (B, K·L, H).
        """
        if encoder_states is None:
            if input_ids is None:
                raise ValueError("FiDReader.forward needs input_ids or encoder_states")
            encoder_states = self.encode(input_ids, attention_mask)
        encoder_outputs, fused_mask = self.fuse(encoder_states, attention_mask)
        return self.seq2seq(
            encoder_outputs=encoder_outputs,
            attention_mask=fused_mask,
            labels=labels,
            decoder_input_ids=decoder_input_ids,
            use_cache=False,
            output_hidden_states=output_hidden_states,
            **self.source_kwargs(input_ids),
        )

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_length: int = 32,
        num_beams: int = 1,
        encoder_states: torch.Tensor | None = None,
        prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], list[int]] | None = None,
        length_penalty: float = 1.0,
        precision: str = "fp32",
        pack_passages: bool = True,
        passage_log_prior: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Greedy (`num_beams`=1) or beam-search decoding of the answer (call in eval mode).

        The cross-attention keys/values are projected once per example, from its real tokens, and
        beam search reads them once for all its beams (`reader.beam_attention`), as does a copy head's
        pointer: T5's own answers, without repeating the K·L encoder states per beam. The decoder reads
        the passages' real tokens packed together (`fuse_packed`), not the padded K·L layout.

        Args:
            input_ids, attention_mask: (B, K, L).
            max_length: most tokens generated after the start token.
            encoder_states: (B, K, L, H) from `encode`, reused instead of encoding again.
            prefix_allowed_tokens_fn: constrained decoding, `(example index, ids so far (T,)) → allowed
                next ids` (e.g. `reader.span_constraint.PassageSpanConstraint`).
            length_penalty: beam search ranks by log-probability / length**length_penalty.
            precision: an `inference.precision` (`reader.int8_decoding.answering_plan`): the encoder pass's
                precision (when `encoder_states` is None) and whether the decoder and LM head run in int8
                ("int8", "bf16-int8", and "auto" on a CPU in eval mode, the weights not partitioned by ZeRO-3);
                otherwise the decoder runs at the reader's precision (bfloat16 autocast slowed its small
                per-step products on CPU: bench/reading.py).
            pack_passages: False decodes over the padded K·L layout (`fuse`): the same answers, slower
                (the baseline of bench/reading.py's `--beam-paths unpacked`).
            passage_log_prior: (B, K) log-weights of the passages (e.g. `passage_log_prior` of their
                retrieval scores): the copy head's pointer copies from passage k in proportion to
                prior_k times its own attention (readers with a copy head only); None = none.
        Returns:
            (B, T') generated ids starting with the decoder start token.
        """
        # long: the one entry of every decoding path (greedy, beam, span answers, packed passages, copy head), each
        # branch a few lines
        encoder_precision, int8 = answering_plan(precision, next(self.seq2seq.parameters()).device)
        if encoder_states is None:
            encoder_states = self.encode(input_ids, attention_mask, precision=encoder_precision)
        if int8 and (precision != "auto" or not (self.seq2seq.training or partitioned(self.seq2seq.decoder))):
            with self.int8_decoding.applied(self.seq2seq):
                return self.generate(
                    *(input_ids, attention_mask, max_length, num_beams, encoder_states, prefix_allowed_tokens_fn),
                    *(length_penalty, "fp32", pack_passages, passage_log_prior),
                )
        source = self.source_kwargs(input_ids)
        if passage_log_prior is not None and not source:
            raise ValueError("passage_log_prior weights the copy head's pointer: this reader has no copy head")
        length = encoder_states.shape[2]
        # each fused position's index in the K·L layout (position k·L + i is passage k's token i)
        positions = torch.arange(encoder_states.shape[1] * length, device=encoder_states.device)
        if pack_passages:
            encoder_outputs, fused_mask, positions = self.fuse_packed(encoder_states, attention_mask)
            if source:
                source = _packed_copy_source(source, attention_mask, positions, fused_mask)
        else:
            encoder_outputs, fused_mask = self.fuse(encoder_states, attention_mask)
        log_prior = None
        if passage_log_prior is not None:  # (B, K) → (B, S) by each position's passage, zero where masked
            passage_of = (positions // length).expand(encoder_states.shape[0], -1)
            log_prior = passage_log_prior.to(encoder_states.device).gather(1, passage_of)
            log_prior = log_prior.masked_fill(fused_mask.eq(0), 0)
        cache = BeamSharedCrossAttentionCache.prefilled(
            self.seq2seq.decoder, encoder_outputs.last_hidden_state, fused_mask
        )
        if pack_passages and has_cross_attention_bias(self.seq2seq):
            # a transformers-3 reader's cross-attention bias depends on each key's place in the K·L layout
            cache.encoder_positions = positions
        if source and isinstance(cache, BeamSharedCrossAttentionCache):  # not a baseline's own cache
            cache.copy_source = CopySource(
                encoder_outputs.last_hidden_state,
                fused_mask,
                source["source_ids"],
                source.get("source_previous_ids"),
                log_prior,
            )
        elif log_prior is not None:
            raise ValueError("passage_log_prior needs the shipped generation path (a BeamSharedCrossAttentionCache)")
        config = self.seq2seq.config
        return self.seq2seq.generate(
            encoder_outputs=encoder_outputs,
            attention_mask=fused_mask,
            max_new_tokens=max_length,
            num_beams=num_beams,
            do_sample=False,
            **{CACHE_KWARG: cache},
            decoder_start_token_id=config.decoder_start_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
            **constraint_kwargs(prefix_allowed_tokens_fn, num_beams, encoder_states.device),
            # beam search's alone: given to greedy decoding, transformers warns that it is ignored
            **({"length_penalty": length_penalty} if num_beams > 1 else {}),
            **source,
        )

    @torch.no_grad()
    def score_options(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        option_token_ids: torch.Tensor,
        prefix_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of each option's token at the first answer position (multiple choice).

        Args:
            input_ids, attention_mask: (B, K, L).
            option_token_ids: (n_options,) one token id per option (e.g. "A".."D").
            prefix_ids: (B, P) target tokens before the answer (e.g. `<extra_id_0>`), or None.
        Returns:
            (B, n_options) logits.
        """
        batch = input_ids.shape[0]
        start = torch.full(
            (batch, 1),
            self.seq2seq.config.decoder_start_token_id,
            dtype=torch.long,
            device=input_ids.device,
        )
        decoder_input_ids = start if prefix_ids is None else torch.cat([start, prefix_ids], dim=1)
        logits = self.forward(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        return logits[:, -1, :].index_select(-1, option_token_ids.to(logits.device))

    # --- gold scores for the retriever losses (no gradient; callers set eval mode) -------
    # (retriever.losses.GoldReader): the functions of `passage_scores` and `attention_scores`, as methods
    per_passage_token_logprobs = passage_scores.per_passage_token_logprobs  # (B, K, T) reading passage k alone
    leave_one_out_nll = passage_scores.leave_one_out_nll  # (B, K) mean target NLL reading all passages but k
    cross_attention_scores = attention_scores.cross_attention_scores  # (B, K) attention × value norm
    copy_attention_scores = attention_scores.copy_attention_scores  # (B, K) copy-head pointer mass

    # --- memory / persistence ---------------------------------------------------------
    def gradient_checkpointing_enable(self) -> None:
        """Recompute T5 block activations in the backward pass (less memory, ~1/3 more time)."""
        self.seq2seq.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False, "context_fn": checkpoint_contexts}
        )

    def save_pretrained(self, path: str | Path, overwrite: bool = False) -> None:
        """Write the reader folder atomically: a plain Hugging Face T5 folder (config.json +
        safetensors), or for a warm-started reader its own folder (`reader.warm_start`)."""
        with atomic_directory(Path(path), overwrite=overwrite) as tmp:
            self.seq2seq.save_pretrained(str(tmp), safe_serialization=True)

    @classmethod
    def from_config(
        cls, config: ReaderConfig, tokenizer: PreTrainedTokenizerBase, *, folder: Path | None = None, seed: int = 0
    ) -> FiDReader:
        """The reader `config` describes, ready to train or answer.

        Weights: those of `folder` (a saved reader: a run's `reader/`) when given, else of `config.model` (a
        preset at random init seeded by `seed`, a warm-start preset, a local folder or a hub name). Then what
        every reader takes from its settings: token embeddings from `init_embeddings` (presets), no encoder
        dropout (`encoder_dropout: false`), the trainable encoder layers (warm-started readers) and gradient
        checkpointing. `tokenizer`: the reader's (`reader.tokenizer.reader_tokenizer(config, folder)`).
        """
        if folder is not None:
            reader = cls.from_pretrained(folder, dropout=config.dropout)
        else:
            reader = build_reader(
                config.model,
                vocab_size=len(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                dropout=config.dropout,
                seed=seed,
                tokenizer=tokenizer,
                encoder=config.encoder,
            )
            if config.init_embeddings:
                reader.init_token_embeddings(config.init_embeddings, tokenizer, preset=config.model)
        if not config.encoder_dropout:
            reader.disable_encoder_dropout()
        if config.trainable_encoder_layers is not None:
            if not isinstance(reader.seq2seq, WarmStartedT5):
                raise ValueError(
                    "reader.trainable_encoder_layers applies to warm-started readers (reader.model a "
                    "warm-start preset or folder); this reader is a plain T5"
                )
            reader.seq2seq.set_trainable_encoder_layers(config.trainable_encoder_layers)
        if config.gradient_checkpointing:
            reader.gradient_checkpointing_enable()
        return reader

    def init_token_embeddings(self, source: str, tokenizer: PreTrainedTokenizerBase, *, preset: str) -> None:
        """Start a preset reader's token embeddings from those of the encoder `source` names ("minilm", a
        folder or hub name), for the tokens both vocabularies hold."""
        if preset not in READER_PRESETS:
            raise ValueError(
                f"reader.init_embeddings applies to a reader built from a preset "
                f"({sorted(READER_PRESETS)}); reader.model {preset!r} has its own weights"
            )
        folder = encoder_source(source)
        encoder = AutoModel.from_pretrained(folder)
        vocab = AutoTokenizer.from_pretrained(folder).get_vocab()
        n = transfer_token_embeddings(self.seq2seq, tokenizer, encoder.get_input_embeddings().weight, vocab)
        logger.info("reader token embeddings: %d of %d from %s", n, len(tokenizer), folder)

    @classmethod
    def from_pretrained(cls, path: str | Path, dropout: float | None = None) -> FiDReader:
        """Load a folder written by `save_pretrained` (or any local HF T5 folder), fp32 weights.

        A config saying `tie_word_embeddings: false` gives an `UntiedT5ForConditionalGeneration` (its
        own `lm_head`, `reader.t5_untied`); one saying `cross_attention_relative_bias: true` gets its
        transformers-3 cross-attention bias back (`reader.cross_attention_bias`).
        """
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder}: not a Hugging Face model folder (no config.json)")
        if is_warm_started_folder(folder):
            return cls(WarmStartedT5.from_folder(folder, dropout=dropout))
        kwargs = {} if dropout is None else {"dropout_rate": dropout}
        model_class = UntiedT5ForConditionalGeneration if saved_untied(folder) else T5ForConditionalGeneration
        t5, info = model_class.from_pretrained(str(folder), dtype=torch.float32, output_loading_info=True, **kwargs)
        if model_class is UntiedT5ForConditionalGeneration and "lm_head.weight" in info["missing_keys"]:
            raise ValueError(
                f"{folder}: config.json says tie_word_embeddings false, but the weights hold no lm_head.weight"
            )
        if getattr(t5.config, CROSS_BIAS_FLAG, False):
            load_cross_attention_bias(t5, folder)
        return cls(t5)


def build_reader(
    model: str,
    vocab_size: int,
    pad_token_id: int = 0,
    eos_token_id: int = 1,
    dropout: float | None = None,
    seed: int | None = None,
    tokenizer=None,
    encoder: str | None = None,
) -> FiDReader:
    """A FiD reader from a preset name (random init, sized to the vocabulary) or a local folder.

    Args:
        model: a name in READER_PRESETS (plain T5), in WARM_START_PRESETS (a pre-trained
            encoder under a new T5 decoder, `reader.warm_start`), or a local reader folder.
        vocab_size, pad_token_id, eos_token_id: from the reader tokenizer (presets only).
        dropout: overrides the dropout rate (presets and folders).
        seed: seeds the random initialisation of a preset.
        tokenizer: the reader tokenizer (warm-start presets map the encoder's embedding to its ids).
        encoder: the pre-trained encoder of a warm-start preset ("minilm", a folder, a hub name).
    """
    if model in WARM_START_PRESETS:
        if tokenizer is None:
            raise ValueError(f"reader preset {model!r} needs the reader tokenizer")
        return FiDReader(build_warm_started(model, tokenizer, encoder=encoder, dropout=dropout, seed=seed))
    if encoder is not None:
        raise ValueError(
            f"reader.encoder applies to the warm-start presets ({sorted(WARM_START_PRESETS)}), "
            f"not to reader.model {model!r}"
        )
    if model in READER_PRESETS:
        config = T5Config(
            vocab_size=vocab_size,
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            decoder_start_token_id=pad_token_id,  # as in T5
            **READER_PRESETS[model],
            **({} if dropout is None else {"dropout_rate": dropout}),
        )
        if seed is not None:
            torch.manual_seed(seed)
        # T5Config forgets `tie_word_embeddings: false` (reader.t5_untied): a v1.1 preset needs the untied class
        untied = READER_PRESETS[model].get("tie_word_embeddings") is False
        return FiDReader((UntiedT5ForConditionalGeneration if untied else T5ForConditionalGeneration)(config))
    folder = Path(model)
    if folder.is_dir():
        # fp32 master weights whatever the folder stores (a shipped fp16 checkpoint would
        # otherwise load as fp16, which CPU training cannot use); autocast handles bf16 runs
        return FiDReader.from_pretrained(folder, dropout=dropout)
    if is_hub_id(model):  # a hub name, e.g. google/t5-base-lm-adapt
        kwargs = {} if dropout is None else {"dropout_rate": dropout}
        try:
            return FiDReader(T5ForConditionalGeneration.from_pretrained(model, **kwargs))
        except OSError as e:
            raise FileNotFoundError(f"reader.model {model!r}: not a local folder, nor found on the Hub ({e})") from None
    if "/" in model or model.startswith("."):
        raise missing_folder(model, "reader.model")
    raise ValueError(
        f"reader model {model!r} is neither a preset ({sorted(READER_PRESETS | WARM_START_PRESETS)}), "
        "a local folder "
        "nor a hub name (owner/name)"
    )


def length_groups(lengths: list[int]) -> list[int]:
    """Sizes of consecutive groups of rows sorted longest first, `lengths`: each group at most
    `ENCODE_GROUP_ROWS` rows, and padded to its first row's length with at most `ENCODE_GROUP_PADDING` of its
    real tokens as padding."""
    sizes, start, real = [], 0, 0
    for i, length in enumerate(lengths):
        rows = i - start + 1
        if rows > ENCODE_GROUP_ROWS or rows * lengths[start] > (1 + ENCODE_GROUP_PADDING) * (real + length):
            sizes.append(i - start)
            start, real = i, 0
        real += length
    return [*sizes, len(lengths) - start] if lengths else []


def constraint_kwargs(prefix_allowed_tokens_fn, num_beams: int, device: torch.device) -> dict:
    """`generate`'s arguments for a constraint, applied to each step at once: the passage-span constraint on the
    device (`DeviceSpanConstraint`: no copy to the host per step), any other function on the host
    (`StepPrefixConstraint`)."""
    if prefix_allowed_tokens_fn is None:
        return {}
    if isinstance(prefix_allowed_tokens_fn, PassageSpanConstraint):
        processor = DeviceSpanConstraint(prefix_allowed_tokens_fn, num_beams, device)
    else:
        processor = StepPrefixConstraint(prefix_allowed_tokens_fn, num_beams)
    return {"logits_processor": LogitsProcessorList([processor])}


def _packed_copy_source(
    source: dict, attention_mask: torch.Tensor, positions: torch.Tensor, fused_mask: torch.Tensor
) -> dict:
    """The copy head's inputs for passages packed by `fuse_packed`: the source ids (B, K·L) of
    `source_kwargs` gathered at the packed `positions` (B, S), each with the id before it in its own
    passage (-1 where there is none); masked positions get 0 / -1."""
    ids = source["source_ids"]
    previous = previous_source_ids(ids, attention_mask.reshape(ids.shape), source["passage_length"])
    return {
        "source_ids": ids.gather(1, positions).masked_fill(fused_mask.eq(0), 0),
        "source_previous_ids": previous.gather(1, positions).masked_fill(fused_mask.eq(0), -1),
    }
