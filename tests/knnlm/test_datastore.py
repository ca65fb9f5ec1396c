"""Token-level datastore: sliding windows, round trip, resume after a crash, mismatches."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from atlas.knnlm.datastore import Datastore, DatastoreManifest, DatastoreWriter, fill_datastore, sliding_windows

DIM = 3


def position_producer(windows: np.ndarray, targets: np.ndarray):
    """Keys encoding (input token, target token, position in window) so rows can be checked."""
    batch, length = windows.shape
    positions = np.broadcast_to(np.arange(length), (batch, length))
    keys = np.stack([windows, targets, positions], axis=-1).astype(np.float16)
    return {"probe": keys, "twice": 2 * keys}, (-targets / 100.0).astype(np.float32)


def new_writer(path, n_tokens: int, meta=None) -> DatastoreWriter:
    return DatastoreWriter(
        path,
        n_rows=n_tokens - 1,
        key_dims={"probe": DIM, "twice": DIM},
        with_lm_logprobs=True,
        meta=meta or {"text": "toy"},
    )


@pytest.mark.parametrize("n_tokens,context,stride", [(50, 12, 5), (9, 12, 4), (40, 8, 8), (30, 6, 1)])
def test_sliding_windows_score_each_row_once_with_enough_context(n_tokens, context, stride):
    windows = sliding_windows(n_tokens, context, stride)
    scored = [row for begin, end, first in windows for row in range(first, end)]
    assert scored == list(range(n_tokens - 1))
    for index, (begin, end, first) in enumerate(windows):
        assert end - begin <= context and begin <= first < end
        if index > 0:
            assert first - begin >= min(context - stride, first)


def test_round_trip_rows_line_up_with_positions(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60, size=50)
    store = fill_datastore(
        new_writer(tmp_path / "ds", len(ids)),
        ids,
        position_producer,
        context=12,
        stride=5,
        batch_size=2,
        progress=False,
    )
    assert len(store) == 49
    np.testing.assert_array_equal(store.values, ids[1:])
    keys = np.asarray(store.keys("probe"), dtype=np.float64)
    np.testing.assert_array_equal(keys[:, 0], ids[:-1])  # key row r comes from input position r
    np.testing.assert_array_equal(keys[:, 1], ids[1:])
    np.testing.assert_array_equal(store.keys("twice"), 2 * store.keys("probe"))
    np.testing.assert_allclose(store.lm_logprobs, -ids[1:] / 100.0, rtol=1e-6)
    # Window-relative positions: first window 0..11, then each later window scores its last 5 of 12.
    np.testing.assert_array_equal(keys[:12, 2], np.arange(12))
    np.testing.assert_array_equal(keys[12:17, 2], np.arange(7, 12))
    assert store.values.dtype == np.int32 and store.keys("probe").dtype == np.float16
    with pytest.raises(ValueError, match=r"key 'nope' not stored; stored keys: \['probe', 'twice'\]"):
        store.keys("nope")


def test_resume_after_crash_gives_byte_identical_files(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 60, size=80)
    kwargs = {"context": 10, "stride": 4, "batch_size": 3, "progress": False}
    fill_datastore(new_writer(tmp_path / "whole", len(ids)), ids, position_producer, **kwargs)

    calls = {"n": 0}

    def crashing(windows, targets):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return position_producer(windows, targets)

    with pytest.raises(KeyboardInterrupt):
        fill_datastore(new_writer(tmp_path / "resumed", len(ids)), ids, crashing, **kwargs)
    progress = json.loads((tmp_path / "resumed" / "progress.json").read_text())
    assert 0 < progress["n_done"] < len(ids) - 1
    with pytest.raises(ValueError, match="incomplete"):
        Datastore(tmp_path / "resumed")

    seen = []

    def recording(windows, targets):
        seen.append(windows.copy())
        return position_producer(windows, targets)

    writer = new_writer(tmp_path / "resumed", len(ids))
    assert writer.n_done == progress["n_done"]
    fill_datastore(writer, ids, recording, **kwargs)
    n_windows = len(sliding_windows(len(ids), 10, 4))
    assert sum(len(w) for w in seen) == n_windows - 2 * 3  # the two committed batches were not recomputed
    for name in [
        "values.npy",
        "keys-probe.npy",
        "keys-twice.npy",
        "lm_logprobs.npy",
        "manifest.json",
    ]:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "resumed" / name).read_bytes(), name


def test_existing_folder_with_other_settings_is_refused(tmp_path):
    ids = np.arange(20)
    fill_datastore(
        new_writer(tmp_path / "ds", len(ids)),
        ids,
        position_producer,
        context=5,
        stride=5,
        batch_size=4,
        progress=False,
    )
    with pytest.raises(ValueError, match=r"differs in \['meta'\]"):
        new_writer(tmp_path / "ds", len(ids), meta={"text": "other"})
    with pytest.raises(ValueError, match="has 19 rows but the text gives 20"):
        fill_datastore(
            new_writer(tmp_path / "ds", len(ids)),
            np.arange(21),
            position_producer,
            context=5,
            stride=5,
            batch_size=4,
            progress=False,
        )


def test_mismatch_message_names_the_differing_metadata(tmp_path):
    ids = np.arange(20)
    new_writer(tmp_path / "ds", len(ids), meta={"text": "toy", "context": 5})
    with pytest.raises(ValueError) as info:
        new_writer(tmp_path / "ds", len(ids), meta={"text": "other", "context": 5})
    assert "meta.text: stored 'toy', now 'other'" in str(info.value)
    assert "meta.context" not in str(info.value)


def test_stores_from_different_producers_are_not_searched_together(tmp_path):
    from atlas.knnlm.datastore import check_same_producer

    ids = np.arange(20)
    kwargs = {"context": 5, "stride": 5, "batch_size": 4, "progress": False}

    def store(name, **meta):
        writer = new_writer(tmp_path / name, len(ids), meta={"text": name, **meta})
        return fill_datastore(writer, ids, position_producer, **kwargs)

    generic_a, generic_b = store("a"), store("b")
    check_same_producer(generic_a, generic_b)  # no producer recorded on either side: accepted
    same_1 = store("m1", model_fingerprint="f1", tokenizer_fingerprint="t1")
    same_2 = store("m2", model_fingerprint="f1", tokenizer_fingerprint="t1")
    check_same_producer(same_1, same_2)
    other_model = store("m3", model_fingerprint="f2", tokenizer_fingerprint="t1")
    with pytest.raises(ValueError, match=r"different producers \(model_fingerprint: 'f1' vs 'f2'\)"):
        check_same_producer(same_1, other_model)
    other_tokenizer = store("m4", model_fingerprint="f1", tokenizer_fingerprint="t2")
    with pytest.raises(ValueError, match="tokenizer_fingerprint: 't1' vs 't2'"):
        check_same_producer(same_1, other_tokenizer)
    with pytest.raises(ValueError, match=r"model_fingerprint: '\(not recorded\)' vs 'f1'"):
        check_same_producer(generic_a, same_1)  # one-sided: cannot be verified


# manifest.json as the datastore has always written it (the dataclass's fields, in order)
WRITTEN = {"n_rows": 19, "key_dims": {"ffn_input:-1": 8}, "with_lm_logprobs": True, "meta": {"text": "toy"}}


def test_the_manifest_round_trips_and_reads_the_file_as_written(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(WRITTEN | {"complete": True}, indent=2) + "\n")
    manifest = DatastoreManifest.load(tmp_path / "old")
    assert manifest == DatastoreManifest(19, {"ffn_input:-1": 8}, True, {"text": "toy"}, complete=True)
    manifest.save(tmp_path / "new")
    assert (tmp_path / "new" / "manifest.json").read_text() == (tmp_path / "old" / "manifest.json").read_text()
    assert DatastoreManifest.from_json(manifest.to_json(), tmp_path / "new" / "manifest.json") == manifest


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda d: d.update(n_rows="19"), "field n_rows must be an integer, got '19'"),
        (lambda d: d.pop("complete"), "field complete is missing"),
        (lambda d: d.update(with_lm_logprobs=1), "field with_lm_logprobs must be true or false, got 1"),
        (lambda d: d["key_dims"].update({"ffn_input:-1": "8"}), "field key_dims.ffn_input:-1 must be an integer"),
        (lambda d: d.update(meta=[]), r"field meta must be an object, got \[\]"),
    ],
)
def test_a_bad_manifest_field_is_one_error_naming_the_file_and_the_field(tmp_path, corrupt, message):
    data = json.loads(json.dumps(WRITTEN | {"complete": True}))
    corrupt(data)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'manifest.json'))}: {message}"):
        Datastore(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match="manifest.json: corrupted datastore manifest"):
        Datastore(tmp_path)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="manifest.json: no datastore manifest"):
        Datastore(tmp_path)
