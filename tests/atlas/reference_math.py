"""What the reference implementations computed, written out in float64 from their formulas, for the
import parity tests (tests/atlas/test_import_parity.py). Nothing here calls this project's code or
a Hugging Face model: state dicts go in, numbers come out.

- `bert_embeddings`: facebookresearch/atlas's Contriever — its own BERT (src/modeling_bert.py), whose
  layer norm divides by the raw second moment, mean-pooled over real tokens.
- `fid_t5_logits` / `greedy`: a T5 reading K passages as Fusion-in-Decoder, optionally with the
  cross-attention position bias of transformers < 4 (a table in the first decoder block, its bias
  added to every block's cross-attention), and transformers 4's greedy decoding, whose `max_length`
  counts the decoder start token.
- `legacy_t5_tokens`: transformers 4's T5 tokenizer pipeline (split at special tokens; collapse
  runs of spaces; spaces → `▁`, one `▁` in front; split before each `▁`; best unigram path per
  piece; `</s>` appended).
"""

from __future__ import annotations

import math
import re

import torch

F64 = torch.float64


def _w(state: dict, key: str) -> torch.Tensor:
    return state[key].to(F64)


# --- the reference's retriever -------------------------------------------------------------------


def second_moment_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """BertLayerNorm of facebookresearch/atlas: w · (x − mean x) / sqrt(mean x² + eps) + b, last axis."""
    x = x.to(F64)
    return weight.to(F64) * (x - x.mean(-1, keepdim=True)) / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) + bias.to(
        F64
    )


def bert_embeddings(
    state: dict, *, heads: int, eps: float, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """(B, L) ids and mask → (B, d) mean-pooled last hidden states of the reference's Contriever.

    state: BertModel keys (`embeddings.…`, `encoder.layer.{i}.…`); GELU is the exact (erf) one, as
    BERT's config says `gelu`; no dropout (eval)."""
    batch, length = input_ids.shape
    h = (
        _w(state, "embeddings.word_embeddings.weight")[input_ids]
        + _w(state, "embeddings.position_embeddings.weight")[:length].unsqueeze(0)
        + _w(state, "embeddings.token_type_embeddings.weight")[0]
    )
    h = second_moment_layer_norm(h, state["embeddings.LayerNorm.weight"], state["embeddings.LayerNorm.bias"], eps)
    keep = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L) keys
    layers = sorted({int(k.split(".")[2]) for k in state if k.startswith("encoder.layer.")})
    for i in layers:
        p = f"encoder.layer.{i}."

        def linear(x, name, p=p):
            return x @ _w(state, p + name + ".weight").T + _w(state, p + name + ".bias")

        d = h.shape[-1] // heads
        q, k, v = (
            linear(h, f"attention.self.{n}").view(batch, length, heads, d).transpose(1, 2)
            for n in ("query", "key", "value")
        )
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(~keep, -math.inf)
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, -1)
        h = second_moment_layer_norm(
            linear(context, "attention.output.dense") + h,
            state[p + "attention.output.LayerNorm.weight"],
            state[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        inner = linear(h, "intermediate.dense")
        inner = 0.5 * inner * (1 + torch.erf(inner / math.sqrt(2)))
        h = second_moment_layer_norm(
            linear(inner, "output.dense") + h,
            state[p + "output.LayerNorm.weight"],
            state[p + "output.LayerNorm.bias"],
            eps,
        )
    mask = attention_mask.to(F64).unsqueeze(-1)
    return (h * mask).sum(1) / mask.sum(1)


# --- the reference's reader ----------------------------------------------------------------------


def bucket(relative: int, *, bidirectional: bool, num_buckets: int, max_distance: int = 128) -> int:
    """T5's relative-position bucket (Mesh TensorFlow) of key position − query position."""
    offset, n = 0, -relative
    if bidirectional:
        num_buckets //= 2
        offset = num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return offset + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return offset + min(large, num_buckets - 1)


def _bias(table: torch.Tensor, query_positions, key_positions, *, bidirectional: bool) -> torch.Tensor:
    """(heads, Tq, Tk) table[bucket(key − query)]."""
    index = torch.tensor(
        [
            [bucket(int(j) - int(i), bidirectional=bidirectional, num_buckets=table.shape[0]) for j in key_positions]
            for i in query_positions
        ]
    )
    return table.to(F64)[index].permute(2, 0, 1)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return weight.to(F64) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _attention(state, prefix, x_q, x_kv, heads, bias, keep, capture=None):
    """T5 attention (no 1/sqrt(d) scaling): x_q (Tq, d), x_kv (Tk, d), bias (heads, Tq, Tk), keep (Tq, Tk) bool."""

    def split(x, name):
        w = _w(state, prefix + name + ".weight")
        return (x @ w.T).view(x.shape[0], heads, -1).transpose(0, 1)  # (heads, T, d_kv)

    q, k, v = split(x_q, "q"), split(x_kv, "k"), split(x_kv, "v")
    scores = q @ k.transpose(-1, -2) + bias
    probs = scores.masked_fill(~keep, -math.inf).softmax(-1)  # (heads, Tq, Tk)
    if capture is not None:
        capture.append((probs, v))
    out = (probs @ v).transpose(0, 1).reshape(x_q.shape[0], -1)
    return out @ _w(state, prefix + "o.weight").T


def _feed_forward(state, prefix, x, gated):
    if gated:  # gelu_new (tanh) of T5 v1.1 / lm-adapt
        a = x @ _w(state, prefix + "wi_0.weight").T
        a = 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
        return (a * (x @ _w(state, prefix + "wi_1.weight").T)) @ _w(state, prefix + "wo.weight").T
    return torch.relu(x @ _w(state, prefix + "wi.weight").T) @ _w(state, prefix + "wo.weight").T


def fid_t5_logits(
    state: dict,
    *,
    heads: int,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    decoder_input_ids: torch.Tensor,
    cross_bias: bool,
    capture: list | None = None,
) -> torch.Tensor:
    """Fusion-in-Decoder logits, (B, T, V), of a T5 state dict.

    input_ids, attention_mask: (B, K, L), each passage encoded alone; the decoder reads the K·L
    states, passage k's token t at position k·L + t. cross_bias: add the transformers-3 bias of
    `decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight` to every block's
    cross-attention. Output scaled by d^-0.5 when there is no own `lm_head` (T5 v1.0).
    capture: receives (probs (heads, T, K·L), values (heads, K·L, d_kv)) of every cross-attention.
    """
    gated = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in state
    n_enc = len({k.split(".")[2] for k in state if k.startswith("encoder.block.")})
    n_dec = len({k.split(".")[2] for k in state if k.startswith("decoder.block.")})
    shared = _w(state, "shared.weight")
    lm_head = _w(state, "lm_head.weight") if "lm_head.weight" in state else None
    batch, n_passages, length = input_ids.shape
    out = []
    for b in range(batch):
        states = []
        for k in range(n_passages):
            real = attention_mask[b, k].bool()
            h = shared[input_ids[b, k]]
            bias = _bias(
                state["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
                range(length),
                range(length),
                bidirectional=True,
            )
            keep = real.unsqueeze(0).expand(length, length)
            for i in range(n_enc):
                p = f"encoder.block.{i}.layer."
                normed = _rms(h, state[p + "0.layer_norm.weight"])
                h = h + _attention(state, p + "0.SelfAttention.", normed, normed, heads, bias, keep)
                h = h + _feed_forward(state, p + "1.DenseReluDense.", _rms(h, state[p + "1.layer_norm.weight"]), gated)
            states.append(_rms(h, state["encoder.final_layer_norm.weight"]))
        memory = torch.cat(states)  # (K·L, d)
        memory_real = attention_mask[b].reshape(-1).bool()
        targets = decoder_input_ids[b]
        t = targets.shape[0]
        h = shared[targets]
        self_bias = _bias(
            state["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
            range(t),
            range(t),
            bidirectional=False,
        )
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        cross = (
            _bias(
                state["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"],
                range(t),
                range(memory.shape[0]),
                bidirectional=False,
            )
            if cross_bias
            else torch.zeros(heads, t, memory.shape[0], dtype=F64)
        )
        cross_keep = memory_real.unsqueeze(0).expand(t, -1)
        for i in range(n_dec):
            p = f"decoder.block.{i}.layer."
            normed = _rms(h, state[p + "0.layer_norm.weight"])
            h = h + _attention(state, p + "0.SelfAttention.", normed, normed, heads, self_bias, causal)
            h = h + _attention(
                state,
                p + "1.EncDecAttention.",
                _rms(h, state[p + "1.layer_norm.weight"]),
                memory,
                heads,
                cross,
                cross_keep,
                capture,
            )
            h = h + _feed_forward(state, p + "2.DenseReluDense.", _rms(h, state[p + "2.layer_norm.weight"]), gated)
        h = _rms(h, state["decoder.final_layer_norm.weight"])
        if lm_head is None:
            out.append((h * shared.shape[1] ** -0.5) @ shared.T)
        else:
            out.append(h @ lm_head.T)
    return torch.stack(out)


def greedy(
    state: dict,
    *,
    heads: int,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_length: int,
    cross_bias: bool,
    start: int = 0,
    eos: int = 1,
) -> list[list[int]]:
    """transformers 4's greedy `generate(max_length=…)`: the decoder sequence, start token included,
    grows by the argmax token until eos or `max_length` tokens in all; one list per example."""
    sequences = []
    for b in range(input_ids.shape[0]):
        ids = [start]
        while len(ids) < max_length:
            logits = fid_t5_logits(
                state,
                heads=heads,
                input_ids=input_ids[b : b + 1],
                attention_mask=attention_mask[b : b + 1],
                decoder_input_ids=torch.tensor([ids]),
                cross_bias=cross_bias,
            )
            ids.append(int(logits[0, -1].argmax()))
            if ids[-1] == eos:
                break
        sequences.append(ids)
    return sequences


# --- the reference's reader tokenizer ----------------------------------------------------------------


def legacy_t5_tokens(text: str, pieces: dict[str, float], specials: dict[str, int], ids: dict[str, int]) -> list[int]:
    """transformers 4.18's fast T5 tokenization of `text` (no character map: plain ASCII text).

    pieces: the unigram vocabulary {piece: log-probability}; specials: {special token: id}, split out
    of the text first; ids: {piece: id}. Each stretch between special tokens: runs of 2+ spaces → one
    space; spaces → `▁`; a `▁` in front unless it starts with one; pieces start at each `▁`; each piece
    segmented by the best-scoring unigram path. `</s>` appended."""
    pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    out: list[int] = []
    for chunk in re.split(pattern, text):
        if not chunk:
            continue
        if chunk in specials:
            out.append(specials[chunk])
            continue
        chunk = re.sub(" {2,}", " ", chunk).replace(" ", "▁")
        if not chunk.startswith("▁"):
            chunk = "▁" + chunk
        for word in re.findall("▁[^▁]*", chunk):
            out += [ids[p] for p in _best_path(word, pieces)]
    return out + [specials["</s>"]]


def _best_path(word: str, pieces: dict[str, float]) -> list[str]:
    """The segmentation of `word` into vocabulary pieces with the highest total score (Viterbi)."""
    best = [(0.0, [])] + [(-math.inf, [])] * len(word)
    for end in range(1, len(word) + 1):
        for start in range(end):
            piece = word[start:end]
            if piece in pieces and best[start][0] + pieces[piece] > best[end][0]:
                best[end] = (best[start][0] + pieces[piece], best[start][1] + [piece])
    if best[-1][0] == -math.inf:
        raise ValueError(f"{word!r} cannot be segmented with the test vocabulary")
    return best[-1][1]
