"""The relative position bias of T5's cross-attention under transformers < 4 (FiD's readers).

transformers 3 gave the first decoder block's cross-attention a bias table of its own,
`decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight` (buckets, heads), and,
as for self-attention, the bias that block computes is handed to every later decoder block's
cross-attention:

    score_{h,i,j} = q_{h,i} · k_{h,j} + table[bucket(j − i), h]        (+ the padding mask)

i: the decoder position (0 = the start token); j: the encoder position in the fused sequence the
decoder reads (passage k's token t at k·L + t in FiD's (B, K·L) layout); bucket: T5's
decoder-side (unidirectional) bucketing of n = max(i − j, 0), exact below buckets/2, logarithmic up
to `relative_attention_max_distance`. transformers 4.0 removed the table (PR #8518), but readers
trained under 3.x, such as facebookresearch/FiD's (it pins 3.0.2), were trained with it: importing
one keeps the table and `reader.beam_attention.BeamFoldedCrossAttention` adds the bias back.

Encoder positions: the index in the sequence the decoder reads (`FiDReader.fuse`'s K·L layout),
or, for packed decoding (`FiDReader.fuse_packed`), each packed token's index in that K·L layout
(`encoder_positions` on the decoding cache). With j ≥ i the bucket is 0, so only the first few
tokens of passage 0 get a bias of their own; FiD padded every passage to `text_maxlength`, this
reader pads to the batch's longest passage: the two layouts give the same bias whenever that
passage has at least as many tokens as the decoder positions (every K·L index of passages 1… is
then ≥ i).

A reader folder records the table in its config (`cross_attention_relative_bias: true`) and its
weights file; `FiDReader.from_pretrained` restores it (transformers' own loader drops the key).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import EncoderDecoderCache
from transformers.models.t5.modeling_t5 import T5Attention

CROSS_BIAS_KEY = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
CONFIG_FLAG = "cross_attention_relative_bias"


def _first_cross_attention(t5: nn.Module) -> nn.Module:
    return t5.decoder.block[0].layer[1].EncDecAttention


def has_cross_attention_bias(t5: nn.Module) -> bool:
    """Whether `t5`'s decoder cross-attention carries the transformers-3 relative position bias."""
    blocks = getattr(getattr(t5, "decoder", None), "block", None)
    return bool(blocks) and bool(getattr(_first_cross_attention(t5), "has_relative_attention_bias", False))


def add_cross_attention_bias(t5: nn.Module, table: torch.Tensor) -> None:
    """Give `t5`'s first decoder block's cross-attention the bias table `table` (buckets, heads), in place,
    and record it in `t5.config` (`cross_attention_relative_bias: true`, saved with the config).

    Raises ValueError when the table's shape is not (relative_attention_num_buckets, num_heads).
    """
    attention = _first_cross_attention(t5)
    expected = (t5.config.relative_attention_num_buckets, t5.config.num_heads)
    if tuple(table.shape) != expected:
        raise ValueError(
            f"{CROSS_BIAS_KEY}: shape {tuple(table.shape)}, this T5 needs {expected} "
            "(relative_attention_num_buckets, num_heads)"
        )
    weight = attention.q.weight
    attention.relative_attention_bias = nn.Embedding(*expected, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        attention.relative_attention_bias.weight.copy_(table)
    attention.has_relative_attention_bias = True
    setattr(t5.config, CONFIG_FLAG, True)


def _weights_files(folder: Path) -> dict[str, Path]:
    """{tensor name: safetensors file} of a saved model folder (single file or sharded with an index)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        return {}
    with safe_open(str(single), framework="pt") as f:
        names = list(f.keys())  # a safetensors handle is not iterable
    return dict.fromkeys(names, single)


def load_cross_attention_bias(t5: nn.Module, folder: str | Path) -> None:
    """Restore the table of a reader folder whose config records one (`cross_attention_relative_bias`).

    Hugging Face's `from_pretrained` skips that key (transformers ≥ 4 lists it as ignorable), so it is
    read from the folder's safetensors here. Raises ValueError naming the file when it is missing.
    """
    folder = Path(folder)
    file = _weights_files(folder).get(CROSS_BIAS_KEY)
    if file is None:
        raise ValueError(f"{folder}: config.json says {CONFIG_FLAG}, but no weights file holds {CROSS_BIAS_KEY}")
    with safe_open(str(file), framework="pt") as f:
        table = f.get_tensor(CROSS_BIAS_KEY)
    add_cross_attention_bias(t5, table.to(_first_cross_attention(t5).q.weight.dtype))


def decoder_offset(cache, layer_idx: int, query_length: int) -> int:
    """The decoder position of the first query row: 0 without a cache; with one, the self-attention
    cache's length less the `query_length` new positions (the block's self-attention has already
    appended them when its cross-attention runs)."""
    if not isinstance(cache, EncoderDecoderCache):
        return 0
    return int(cache.self_attention_cache.get_seq_length(layer_idx)) - query_length


def cross_attention_bias(
    attention: nn.Module,
    query_length: int,
    key_length: int,
    *,
    offset: int = 0,
    encoder_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The bias the cross-attention of every decoder block adds to its scores.

    Args:
        attention: the first decoder block's cross-attention (holding `relative_attention_bias`).
        query_length: T decoder positions, `offset` … `offset` + T − 1.
        key_length: S encoder positions the decoder reads.
        encoder_positions: (B, S) each key's position in FiD's K·L layout (packed decoding); None =
            0 … S − 1 (the K·L layout itself).
    Returns:
        (1, heads, T, S) without `encoder_positions`, else (B, heads, T, S), in the table's dtype.
    """
    table = attention.relative_attention_bias.weight  # (buckets, heads)
    decoder = torch.arange(query_length, device=table.device) + offset  # (T,)
    if encoder_positions is None:
        encoder_positions = torch.arange(key_length, device=table.device).unsqueeze(0)  # (1, S)
    relative = encoder_positions.to(table.device).unsqueeze(1) - decoder.view(1, -1, 1)  # (B, T, S): j − i
    buckets = T5Attention._relative_position_bucket(
        relative,
        bidirectional=False,
        num_buckets=attention.relative_attention_num_buckets,
        max_distance=attention.relative_attention_max_distance,
    )
    return nn.functional.embedding(buckets, table).permute(0, 3, 1, 2)  # (B, heads, T, S)
