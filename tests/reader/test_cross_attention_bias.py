"""A reader with the transformers-3 cross-attention bias (`reader.cross_attention_bias`) keeps it through
save and load (single or sharded weights); a folder that claims it without the tensor, or a table of the
wrong shape, is refused by name. Its numbers are checked against the formula in
tests/atlas/test_import_parity.py."""

from __future__ import annotations

import json

import pytest
import torch

from reader.cross_attention_bias import (
    CONFIG_FLAG,
    CROSS_BIAS_KEY,
    add_cross_attention_bias,
    has_cross_attention_bias,
)
from reader.fid import FiDReader
from tests.reader.conftest import random_batch, tiny_t5


def biased_reader() -> FiDReader:
    t5 = tiny_t5(seed=4)
    torch.manual_seed(5)
    add_cross_attention_bias(t5, torch.randn(t5.config.relative_attention_num_buckets, t5.config.num_heads))
    return FiDReader(t5).eval()


@pytest.mark.parametrize("sharded", [False, True], ids=["one-file", "sharded"])
def test_the_bias_survives_save_and_load(tmp_path, sharded):
    reader = biased_reader()
    assert has_cross_attention_bias(reader.seq2seq) and not has_cross_attention_bias(tiny_t5())
    input_ids, mask, labels = random_batch()
    with torch.no_grad():
        before = reader(input_ids=input_ids, attention_mask=mask, labels=labels).logits
    if sharded:
        reader.seq2seq.save_pretrained(str(tmp_path / "reader"), max_shard_size="20KB")
        assert (tmp_path / "reader" / "model.safetensors.index.json").is_file()
    else:
        reader.save_pretrained(tmp_path / "reader")
    assert json.loads((tmp_path / "reader" / "config.json").read_text())[CONFIG_FLAG] is True
    loaded = FiDReader.from_pretrained(tmp_path / "reader").eval()
    table = loaded.seq2seq.decoder.block[0].layer[1].EncDecAttention.relative_attention_bias.weight
    assert torch.equal(table, reader.seq2seq.decoder.block[0].layer[1].EncDecAttention.relative_attention_bias.weight)
    with torch.no_grad():
        after = loaded(input_ids=input_ids, attention_mask=mask, labels=labels).logits
    assert torch.equal(before, after)
    without = FiDReader(tiny_t5(seed=4)).eval()
    with torch.no_grad():
        assert not torch.allclose(without(input_ids=input_ids, attention_mask=mask, labels=labels).logits, after)


def test_a_claimed_bias_without_its_tensor_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    biased_reader().save_pretrained(tmp_path / "reader")
    weights = tmp_path / "reader" / "model.safetensors"
    state = load_file(str(weights))
    del state[CROSS_BIAS_KEY]
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"no weights file holds {CROSS_BIAS_KEY}"):
        FiDReader.from_pretrained(tmp_path / "reader")


def test_a_table_of_the_wrong_shape_is_refused():
    t5 = tiny_t5()
    with pytest.raises(ValueError, match=r"shape \(4, 32\), this T5 needs \(32, 4\)"):
        add_cross_attention_bias(t5, torch.zeros(4, 32))
    assert not has_cross_attention_bias(t5)
