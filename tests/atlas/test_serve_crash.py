"""Crash safety of live corpus edits: kill -9 at the worst moments, then restart.

First at the level of `retriever.index.update` (an update that dies just before or just after
the manifest is replaced leaves exactly the old index or exactly the new one, and it verifies),
then a real `atlas serve` subprocess killed with SIGKILL while an edit is in flight, and restarted.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from atlas.cli import main as atlas_main
from retriever.index import PassageIndex

REPO = Path(__file__).resolve().parents[2]


def _live_texts(folder: Path) -> dict[str, str]:
    """id → text of every live passage of the index at `folder` (as a restart would load it)."""
    index = PassageIndex.load(folder)
    rows = [r for r in range(index.manifest.total) if not index.removed[r]]
    return {p["id"]: p["text"] for p in index.passages(rows)}


class Crash(BaseException):
    """Stands for the process dying at that point (nothing after it runs; no handler catches it)."""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_replace_that_dies_around_its_commit_leaves_the_old_or_the_new_index(tiny_world, tmp_path, monkeypatch, when):
    """Dies with every new file written and flushed but the manifest not replaced ("before"), or
    with the manifest replaced but the superseded files not yet deleted ("after")."""
    from retriever.index import update
    from retriever.index.manifest import Manifest
    from retriever.retriever import Retriever

    folder = tmp_path / "index"
    shutil.copytree(tiny_world["index"], folder)
    before = _live_texts(folder)
    new_file = tmp_path / "edit.jsonl"
    new_file.write_text(
        json.dumps({"id": "p1", "title": "Zorbland", "text": "The capital of Zorbland is Lorient."})
        + "\n"
        + json.dumps({"id": "p9", "title": "New", "text": "A new passage."})
        + "\n"
    )
    real = Manifest.save  # the commit point of every update (files.commit)

    def dies(manifest, folder_):
        if when == "after":
            real(manifest, folder_)
        raise Crash

    monkeypatch.setattr(Manifest, "save", dies)
    retriever = Retriever.from_pretrained(tiny_world["encoder"])
    with pytest.raises(Crash):
        update.add_passages(
            folder, update.read_passage_files([new_file])[0], retriever, chunk_words=0, progress=False, remove=["p1"]
        )
    monkeypatch.setattr(Manifest, "save", real)
    after = _live_texts(folder)
    if when == "before":
        assert after == before  # nothing of the edit
    else:
        assert after == {**before, "p1": "The capital of Zorbland is Lorient.", "p9": "A new passage."}
    assert atlas_main(["index", "info", "--index", str(folder), "--verify"]) == 0
    # and the next edit goes through (the dead one's left-over files are no obstacle)
    new_file.write_text(json.dumps({"id": "p1", "title": "Zorbland", "text": "Its capital is Brest."}) + "\n")
    update.add_passages(
        folder, update.read_passage_files([new_file])[0], retriever, chunk_words=0, progress=False, remove=["p1"]
    )
    assert _live_texts(folder)["p1"] == "Its capital is Brest."
    assert atlas_main(["index", "info", "--index", str(folder), "--verify"]) == 0


def test_replacing_an_id_that_is_not_live_changes_nothing(tiny_world, tmp_path):
    from retriever.index.update import add_passages, read_passage_files
    from retriever.retriever import Retriever

    folder = tmp_path / "index"
    shutil.copytree(tiny_world["index"], folder)
    manifest = (folder / "manifest.json").read_text()
    new_file = tmp_path / "edit.jsonl"
    new_file.write_text(json.dumps({"id": "p1", "text": "x"}) + "\n")
    retriever = Retriever.from_pretrained(tiny_world["encoder"])
    with pytest.raises(KeyError, match="'nope'"):
        add_passages(
            folder, read_passage_files([new_file])[0], retriever, chunk_words=0, progress=False, remove=["nope"]
        )
    with pytest.raises(ValueError, match="already in the index"):  # p1 is live and not replaced
        add_passages(folder, read_passage_files([new_file])[0], retriever, chunk_words=0, progress=False)
    assert (folder / "manifest.json").read_text() == manifest
    corpora = folder / "corpora"
    assert not corpora.exists() or not any(corpora.iterdir())  # the prepared segment was cleaned up


def _bench():
    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "bench" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # two server starts
def test_kill_9_of_the_server_during_an_edit_then_restart(tmp_path_factory, tmp_path):
    pytest.importorskip("fastapi", reason="atlas serve needs fastapi (pip install -e '.[test]')")
    import httpx

    from atlas.serve.demo import build_demo_run

    bench = _bench()
    run = build_demo_run(tmp_path_factory.getbasetemp() / "serve-demo")
    index = tmp_path / "index"
    shutil.copytree(run.parent / "index", index)
    before = _live_texts(index)
    port = bench.free_port()
    url = f"http://127.0.0.1:{port}"
    server = bench.start_server(run, index, port=port, max_batch=8, log=tmp_path / "server-1.log")
    try:
        bench.wait_healthy(url, server)
        # a big edit (31 new passages and one rewrite) so that it is surely in flight when killed
        edit = {
            "add": [{"id": f"kill-{n}", "text": f"Passage {n} of the edit that is killed. " * 20} for n in range(31)],
            "update": [{"id": "country-biole", "text": "Biole is an island. Its capital is Quillmoor."}],
        }
        responses: list = []

        def send() -> None:
            try:
                responses.append(httpx.post(f"{url}/api/edits", json=edit, headers=bench.AUTH, timeout=120))
            except httpx.TransportError as e:  # the server died under it: expected
                responses.append(e)

        sender = threading.Thread(target=send, daemon=True)
        corpora = index / "corpora"
        sender.start()
        deadline = time.monotonic() + 60
        while not (corpora.exists() and any(corpora.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.002)  # the edit's new corpus segment appears: it is being written
        assert corpora.exists(), "the edit never started writing"
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        sender.join(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert not any(getattr(r, "status_code", None) == 200 for r in responses)  # killed before it answered
    after = _live_texts(index)
    assert after == before or (
        len(after) == len(before) + 31 and after["country-biole"] == edit["update"][0]["text"]
    ), "a half-applied edit"
    assert atlas_main(["index", "info", "--index", str(index), "--verify"]) == 0

    server = bench.start_server(run, index, port=port, max_batch=8, log=tmp_path / "server-2.log")
    try:
        health = bench.wait_healthy(url, server)
        assert health["passages"] == len(after)  # the last committed state
        served = httpx.get(f"{url}/api/passages/country-biole", timeout=30).json()["text"]
        assert served == after["country-biole"]
        again = httpx.put(
            f"{url}/api/passages/country-biole", json={"text": "Its capital is Brest."}, headers=bench.AUTH, timeout=120
        )
        assert again.status_code == 200, again.text
        answer = httpx.post(f"{url}/api/ask", json={"question": "What is the capital of Biole?"}, timeout=120)
        assert answer.json()["answer"].lower() == "brest"
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert atlas_main(["index", "info", "--index", str(index), "--verify"]) == 0
