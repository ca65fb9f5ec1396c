"""Cross-attention scores per passage, the gold scores of attention distillation (`adist`).

gold_k = Σ_layers Σ_t Σ_{j ∈ passage k} mean_heads(α_{h,t,j} · ‖v_{h,j}‖) / (layers × T_valid)

where α are the decoder's cross-attention probabilities, v_{h,j} head h's value vector of
encoder state j, and t runs over the non-ignored target positions. α is recomputed here from
the query input of each cross-attention module (captured by a forward pre-hook) instead of
`output_attentions`, which returns nothing under sdpa attention in transformers 5 and would
need the attention implementation switched on the shared config.
"""

from __future__ import annotations

import torch

from reader.cross_attention_bias import cross_attention_bias, has_cross_attention_bias
from reader.inputs import IGNORE_INDEX
from reader.protocol import FusionReader


def _split_heads(states: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, S, n_heads·d) → (B, n_heads, S, d)."""
    batch, length, _ = states.shape
    return states.view(batch, length, n_heads, -1).transpose(1, 2)


def cross_attention_scores(
    reader: FusionReader,
    encoder_states: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    input_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention-times-value-norm mass that the decoder puts on each passage.

    Args:
        encoder_states: (B, K, L, H) from `FiDReader.encode`.
        attention_mask: (B, K, L).
        labels: (B, T), -100 at ignored positions (teacher-forced decoder inputs).
        input_ids: (B, K, L) the encoder input ids (needed by a reader with a copy head).
    Returns:
        (B, K) float32 scores (see the module docstring).
    """
    batch, n_passages, length = encoder_states.shape[:3]
    modules = [block.layer[1].EncDecAttention for block in reader.seq2seq.decoder.block]
    queries_in: list[torch.Tensor] = []
    projected: dict[str, list[torch.Tensor]] = {"k": [], "v": []}  # each layer's keys and values, as it made them

    def capture(_module, args, kwargs):
        queries_in.append(args[0] if args else kwargs["hidden_states"])

    handles = [m.register_forward_pre_hook(capture, with_kwargs=True) for m in modules]
    for m in modules:
        for name in ("k", "v"):
            handles.append(getattr(m, name).register_forward_hook(lambda _m, _a, out, n=name: projected[n].append(out)))
    try:
        reader(input_ids=input_ids, attention_mask=attention_mask, encoder_states=encoder_states, labels=labels)
    finally:
        for handle in handles:
            handle.remove()
    if not len(queries_in) == len(projected["k"]) == len(projected["v"]) == len(modules):
        raise RuntimeError(f"captured {len(queries_in)} cross-attention inputs for {len(modules)} layers")

    key_mask = attention_mask.reshape(batch, 1, 1, n_passages * length).bool()
    bias = None  # a transformers-3 reader's cross-attention position bias, (1, h, T, K·L), on every layer
    if has_cross_attention_bias(reader.seq2seq):
        bias = cross_attention_bias(modules[0], labels.shape[1], n_passages * length).float()
    valid_t = (labels != IGNORE_INDEX).to(torch.float32)  # (B, T)
    total = torch.zeros(batch, n_passages * length, dtype=torch.float32, device=encoder_states.device)
    for module, query_in, keys, values in zip(modules, queries_in, projected["k"], projected["v"]):
        n_heads = module.n_heads
        q = _split_heads(module.q(query_in), n_heads).float()  # (B, h, T, d)
        k = _split_heads(keys, n_heads).float()  # (B, h, K·L, d): the pass's own, not projected again
        v = _split_heads(values, n_heads).float()
        logits = torch.matmul(q, k.transpose(-1, -2)) * getattr(module, "scaling", 1.0)
        if bias is not None:
            logits = logits + bias
        logits = logits.masked_fill(~key_mask, torch.finfo(logits.dtype).min)
        alpha = logits.softmax(dim=-1)  # (B, h, T, K·L)
        weighted = (alpha * v.norm(dim=-1).unsqueeze(2)).mean(dim=1)  # (B, T, K·L)
        total += torch.einsum("btj,bt->bj", weighted, valid_t)
    normaliser = len(modules) * valid_t.sum(-1).clamp(min=1)  # (B,)
    return total.view(batch, n_passages, length).sum(-1) / normaliser.unsqueeze(-1)


def copy_attention_scores(
    reader: FusionReader,
    encoder_states: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    input_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Copy mass on each passage, for a reader with a copy head (the gold of `adist` with `attention: copy`).

    gold_k = Σ_t σ(−g_t) · Σ_{j ∈ passage k} α^copy_{t,j} / T_valid: the probability that the reader
    copies target token t from passage k, averaged over the non-ignored target positions. The copy
    distribution α^copy is the reader's own pointer over the K·L input tokens and σ(−g_t) its
    probability of copying rather than generating (`reader.copy_head.CopyHead.copy_attention`).

    Args:
        encoder_states: (B, K, L, H); attention_mask: (B, K, L); labels: (B, T), -100 ignored;
        input_ids: (B, K, L) the encoder input ids (required; optional in the signature only, as in
            `retriever.losses.GoldReader`).
    Returns:
        (B, K) float32 scores (float64 for a float64 reader) in [0, 1], summing to at most 1 over passages.
    """
    if input_ids is None:
        raise ValueError("copy attention scores need the encoder input ids")
    head = getattr(reader.seq2seq, "copy_head", None)
    if head is None:
        raise ValueError("copy attention scores need a reader with a copy head (a warm-started reader with copy)")
    batch, n_passages, length, _ = encoder_states.shape
    captured: list[tuple] = []

    def capture(_module, args, kwargs):
        captured.append((args, kwargs))

    handle = head.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        reader(input_ids=input_ids, attention_mask=attention_mask, encoder_states=encoder_states, labels=labels)
    finally:
        handle.remove()
    (decoder_states, _vocab, fused, mask, source_ids, *rest), kwargs = captured[0]
    attention, gate = head.copy_attention(decoder_states, fused, mask, source_ids, *rest, **kwargs)
    copying = torch.sigmoid(-gate.squeeze(-1))  # (B, T), float32 (float64 for a float64 head)
    valid_t = (labels != IGNORE_INDEX).to(copying.dtype)
    per_token = attention.view(batch, -1, n_passages, length).sum(-1)  # (B, T, K)
    total = torch.einsum("btk,bt->bk", per_token, copying * valid_t)
    return total / valid_t.sum(-1).clamp(min=1).unsqueeze(-1)
