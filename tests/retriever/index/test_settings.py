"""An index's settings, written once: their defaults reach the recipe, the command line and the build as they
are, and a bad value is refused before any work."""

from __future__ import annotations

import argparse
import sys

import pytest

from atlas.config import AtlasConfig, load_config
from retriever.index.settings import DEFAULTS, IndexSettings


def test_the_recipe_and_the_command_line_take_their_defaults_from_the_settings():
    from atlas.cli.index_commands import add_index_settings

    index = AtlasConfig().index
    assert (index.spec, index.chunk_size, index.train_sample, index.nprobe, index.ef_search) == (
        "Flat",
        8192,
        262144,
        32,
        128,
    )
    parser = argparse.ArgumentParser()
    add_index_settings(parser, "spec", "chunk_size", "train_sample", "keep_embeddings", "exact_rerank", "nprobe")
    assert IndexSettings.of(parser.parse_args([])) == DEFAULTS
    given = IndexSettings.of(parser.parse_args(["--spec", "IVF8,PQ4", "--exact-rerank", "40", "--nprobe", "8"]))
    assert (given.spec, given.exact_rerank, given.nprobe, given.keeps_vectors) == ("IVF8,PQ4", 40, 8, True)
    searching = argparse.ArgumentParser()
    add_index_settings(searching, "nprobe", "ef_search", "exact_rerank", at_search=True)
    assert vars(searching.parse_args([])) == {"nprobe": None, "ef_search": None, "exact_rerank": None}


def test_a_run_builds_with_its_index_section_and_its_retrievers_batch_size():
    config = load_config(
        None, ["index.spec=HNSW16", "index.exact_rerank=null", "index.chunk_size=512", "retriever.batch_size=16"]
    )
    settings = config.index_settings()
    assert (settings.spec, settings.chunk_size, settings.batch_size) == ("HNSW16", 512, 16)
    # the config's null means the index's own: a build re-ranks none and records 0
    assert (settings.exact_rerank, settings.rerank_width, settings.keeps_vectors) == (None, 0, False)


def test_exact_rerank_has_one_default_for_the_recipe_the_command_line_and_the_build():
    from atlas.cli.index_commands import add_index_settings

    building, searching = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_index_settings(building, "exact_rerank")
    add_index_settings(searching, "exact_rerank", at_search=True)
    defaults = {
        DEFAULTS.exact_rerank,
        AtlasConfig().index.exact_rerank,
        building.parse_args([]).exact_rerank,
        searching.parse_args([]).exact_rerank,
    }
    assert defaults == {None}
    assert IndexSettings(exact_rerank=40).rerank_width == 40 and IndexSettings(exact_rerank=0).keeps_vectors is False


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"chunk_size": 0}, "chunk_size must be a positive integer, got 0"),
        ({"nprobe": True}, "nprobe must be a positive integer, got True"),
        ({"exact_rerank": -1}, "exact_rerank must be an integer k' >= 0"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(given, message):
    with pytest.raises(ValueError, match=message):
        IndexSettings(**given)
    with pytest.raises(TypeError, match="chunk_sise"):
        IndexSettings(chunk_sise=8)


def test_the_settings_are_light_to_import():
    import subprocess

    code = "import retriever.index.settings, atlas.config, sys; print('faiss' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_the_recipes_index_section_holds_every_build_setting_but_the_two_owned_elsewhere():
    """One list: each build setting is a key of the recipe's `index` section with the settings' own default, except
    `batch_size` (the retriever's: `retriever.batch_size`) and `seed` (the sample's, 0 in a run), and a run's
    settings are read from the section by name."""
    import dataclasses

    from retriever.index.settings import IndexConfig

    recipe = {f.name: f for f in dataclasses.fields(IndexConfig)}
    for field in dataclasses.fields(IndexSettings):
        if field.name in ("batch_size", "seed"):
            assert field.name not in recipe
            continue
        assert recipe[field.name].default == field.default, field.name
    values = {"spec": "IVF4,Flat", "chunk_size": 64, "train_sample": 99, "keep_embeddings": True, "exact_rerank": 7}
    values |= {"nprobe": 3, "ef_search": 5}
    config = load_config(None, [f"index.{key}={value}" for key, value in values.items()])
    assert {key: getattr(config.index_settings(), key) for key in values} == values
