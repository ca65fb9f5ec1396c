"""The model helpers retriever and reader share: encoder names and the eval-mode context."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from common.modeling import CONTRIEVER_HUB_NAME, encoder_source, eval_mode


def test_encoder_names_resolve_to_a_folder_or_a_hub_name():
    assert (Path(encoder_source("minilm")) / "config.json").is_file()
    assert encoder_source("contriever") == CONTRIEVER_HUB_NAME
    assert encoder_source("some/folder") == "some/folder"


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_restores_the_mode_even_when_the_body_raises(training):
    module = nn.Sequential(nn.Dropout(0.5)).train(training)
    with eval_mode(module):
        assert not module.training and not module[0].training
    assert module.training is training and module[0].training is training
    with pytest.raises(RuntimeError), eval_mode(module):
        raise RuntimeError("a failed refresh")
    assert module.training is training and module[0].training is training
