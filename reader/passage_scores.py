"""Per-passage likelihoods of the target, for the retriever's gold scores.

Both functions take encoder states computed once for all B·K passages (`FiDReader.encode`)
and only run decoder passes on them, so a gold score costs one encoder pass instead of a
full reader pass per passage. They run under whatever grad/train mode the caller set (the
retriever losses call them under `torch.no_grad()` with the reader in eval mode).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from reader.beam_attention import CACHE_KWARG, output_cache
from reader.inputs import IGNORE_INDEX
from reader.protocol import FusionReader


def target_token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[a_t] per position, 0 where labels are ignored.

    Args:
        logits: (N, T, V); labels: (N, T) with -100 at ignored positions.
    Returns:
        (N, T) float32 log-probabilities.
    """
    logprobs = F.log_softmax(logits.float() / temperature, dim=-1)
    valid = labels != IGNORE_INDEX
    picked = logprobs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked.masked_fill(~valid, 0.0)


def per_passage_token_logprobs(
    reader: FusionReader,
    encoder_states: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    input_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token log-likelihoods of the target with the reader reading each passage alone.

    One decoder pass over B·K sequences, each cross-attending to its own passage's L states.

    Args:
        encoder_states: (B, K, L, H) from `FiDReader.encode`.
        attention_mask: (B, K, L).
        labels: (B, T), -100 at ignored positions.
        temperature: divides the logits before the softmax (1 = the reader's distribution).
        input_ids: (B, K, L) the encoder input ids (needed by a reader with a copy head).
    Returns:
        (B, K, T) log p(a_t | a_<t, q, d_k); 0 at ignored positions.
    """
    batch, n_passages, length, hidden = encoder_states.shape
    states = encoder_states.reshape(batch * n_passages, 1, length, hidden)
    mask = attention_mask.reshape(batch * n_passages, 1, length)
    repeated_labels = labels.repeat_interleave(n_passages, dim=0)  # (B·K, T)
    logits = reader(
        input_ids=None if input_ids is None else input_ids.reshape(batch * n_passages, 1, length),
        attention_mask=mask,
        encoder_states=states,
        decoder_input_ids=reader.shift_right(repeated_labels),
    ).logits
    token_logprobs = target_token_logprobs(logits, repeated_labels, temperature)
    return token_logprobs.view(batch, n_passages, -1)


def leave_one_out_nll(
    reader: FusionReader,
    encoder_states: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    input_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean token NLL of the target when the reader reads all passages except passage k.

    The encoder states and their cross-attention projections are computed once; K decoder
    passes each mask out one passage.

    Args:
        encoder_states: (B, K, L, H); attention_mask: (B, K, L); labels: (B, T).
        input_ids: (B, K, L) the encoder input ids (needed by a reader with a copy head).
    Returns:
        (B, K) mean NLL over the non-ignored target tokens (higher = passage k matters more).
    """
    n_passages = encoder_states.shape[1]
    encoder_outputs, _ = reader.fuse(encoder_states, attention_mask)
    decoder_input_ids = reader.shift_right(labels)
    n_tokens = (labels != IGNORE_INDEX).sum(-1).clamp(min=1)  # (B,)
    # The cross-attention keys/values of the K·L encoder states are the same in every pass
    # (only the mask changes): project them once, then hand them to each pass in a cache
    # whose self-attention part starts empty.
    cross_cache = None
    scores = []
    for left_out in range(n_passages):
        mask = attention_mask.clone()
        mask[:, left_out] = 0
        cache = None if cross_cache is None else EncoderDecoderCache(DynamicCache(), cross_cache)
        output = reader.seq2seq(
            encoder_outputs=encoder_outputs,
            attention_mask=mask.flatten(1),
            decoder_input_ids=decoder_input_ids,
            **{CACHE_KWARG: cache},
            use_cache=True,
            **reader.source_kwargs(input_ids),
        )
        cross_cache = output_cache(output).cross_attention_cache
        scores.append(-target_token_logprobs(output.logits, labels).sum(-1) / n_tokens)
    return torch.stack(scores, dim=1)
