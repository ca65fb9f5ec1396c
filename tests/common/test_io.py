"""The shared write helpers are durable: what they commit is fsync'd (data, then the folder that names it), and
an overwrite of a folder swaps in one step.

The fsyncs are observed with a wrapper over the real `os.fsync` that records which file or folder each fd is
(`/proc/self/fd`) and then calls it; renames and deletions likewise. Nothing of `common.io` is replaced, except in
the one test that takes `renameat2` away to run the fallback of systems without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common import io

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")


class Observer:
    """Records `fsync <path>`, `rename <src> <dst>`, `unlink <path>` in call order, and what the folder `watched`
    held (its `marker` file's text, or None when absent) before and after each call."""

    def __init__(self, monkeypatch, watched: Path | None = None):
        self.events: list[tuple] = []
        self.seen: list[str | None] = []
        self.watched = watched
        real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

        def fsync(fd):
            self.look()
            path = os.readlink(f"/proc/self/fd/{fd}")
            self.events.append(("fsync", path, os.path.isdir(path)))
            real_fsync(fd)
            self.look()

        def renamer(real, kind):
            def rename(src, dst, **kwargs):
                self.look()
                self.events.append((kind, os.fspath(src), os.fspath(dst)))
                real(src, dst, **kwargs)
                self.look()

            return rename

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", renamer(real_rename, "rename"))
        monkeypatch.setattr(os, "replace", renamer(real_replace, "replace"))

    def look(self) -> None:
        if self.watched is not None:
            marker = self.watched / "marker"
            self.seen.append(marker.read_text() if marker.exists() else None)

    def index(self, kind: str, path) -> int:
        """The position of the first event of `kind` on `path` (its first path argument)."""
        return next(n for n, e in enumerate(self.events) if e[0] == kind and e[1] == os.fspath(path))

    def fsynced(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "fsync"]


def test_atomic_directory_fsyncs_every_file_and_folder_before_the_rename_then_the_parent(tmp_path, monkeypatch):
    final = tmp_path / "out" / "index"  # `out` does not exist yet: its creation is made durable too
    observer = Observer(monkeypatch)
    with io.atomic_directory(final) as tmp:
        (tmp / "a.bin").write_bytes(b"a" * 10)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.json").write_text("{}")
        # a file written by another process (as C code or a memory map would write it): flushed all the same
        subprocess.run([sys.executable, "-c", f"open({str(tmp / 'c.txt')!r}, 'w').write('c')"], check=True)
    assert (final / "sub" / "b.json").read_text() == "{}"
    rename = next(n for n, e in enumerate(observer.events) if e[0] == "rename")
    assert observer.events[rename][2] == str(final)
    before = {Path(p).relative_to(tmp) for p in observer.fsynced()[:rename] if Path(p).is_relative_to(tmp)}
    assert before == {Path("a.bin"), Path("sub/b.json"), Path("c.txt"), Path("sub"), Path(".")}
    after = [e[1] for e in observer.events[rename:] if e[0] == "fsync"]
    assert after == [str(p) for p in final.parents]  # the new name is durable, and the way to it
    assert str(tmp_path) in observer.fsynced()[:rename]  # `out`'s own name, made before anything else


@pytest.mark.parametrize("helper", ["atomic_write_bytes", "write_jsonl"])
def test_file_helpers_fsync_the_data_before_the_rename_and_the_folder_after(tmp_path, monkeypatch, helper):
    path = tmp_path / "records.jsonl"
    path.write_text("old\n")
    observer = Observer(monkeypatch)
    if helper == "write_jsonl":
        assert io.write_jsonl(path, [{"id": 1}, {"id": 2}]) == 2
        assert [json.loads(line) for line in path.read_text().splitlines()] == [{"id": 1}, {"id": 2}]
    else:
        io.atomic_write_bytes(path, b"new")
        assert path.read_bytes() == b"new"
    _, tmp, target = next(e for e in observer.events if e[0] == "replace")
    assert target == str(path) and Path(tmp).parent == tmp_path
    replace = observer.index("replace", tmp)
    assert observer.index("fsync", tmp) < replace  # the data, under its temporary name
    assert [e[1] for e in observer.events[replace:] if e[0] == "fsync"] == [str(p) for p in path.parents]


def filled(folder: Path, text: str) -> None:
    (folder / "marker").write_text(text)
    (folder / "data.bin").write_bytes(text.encode() * 100)


@pytest.mark.skipif(io._renameat2() is None, reason="this libc has no renameat2")
def test_an_overwrite_swaps_in_one_step_old_or_new_at_every_moment(tmp_path, monkeypatch):
    final = tmp_path / "index"
    with io.atomic_directory(final) as tmp:
        filled(tmp, "old")
    observer = Observer(monkeypatch, watched=final)
    with io.atomic_directory(final, overwrite=True) as tmp:
        filled(tmp, "new")
    assert (final / "marker").read_text() == "new" and (final / "data.bin").read_bytes() == b"new" * 100
    assert observer.seen[0] == "old" and observer.seen[-1] == "new"
    assert set(observer.seen) == {"old", "new"}, observer.seen  # never None: no moment without a folder
    assert [p.name for p in tmp_path.iterdir()] == ["index"]  # the old folder is gone, nothing left beside
    assert observer.fsynced()[-1] == str(tmp_path)  # the swap made durable


def test_without_renameat2_the_fallback_replaces_the_folder_with_a_gap(tmp_path, monkeypatch):
    """Systems without the exchange (macOS, old kernels) rename the old folder aside, then the new one in: the
    result is right, and the observer sees the moment in between that the exchange removes."""
    final = tmp_path / "index"
    with io.atomic_directory(final) as tmp:
        filled(tmp, "old")
    monkeypatch.setattr(io, "_renameat2", lambda: None)
    observer = Observer(monkeypatch, watched=final)
    with io.atomic_directory(final, overwrite=True) as tmp:
        filled(tmp, "new")
    assert (final / "marker").read_text() == "new"
    assert None in observer.seen  # the gap this test's sibling shows is gone with renameat2
    assert [p.name for p in tmp_path.iterdir()] == ["index"]


@pytest.mark.skipif(io._renameat2() is None, reason="this libc has no renameat2")
def test_a_reader_in_another_process_never_finds_the_folder_missing_during_overwrites(tmp_path):
    final = tmp_path / "index"
    with io.atomic_directory(final) as tmp:
        filled(tmp, "0")
    stop = tmp_path / "stop"
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import os, sys
                reads = missing = 0
                started = False
                while not os.path.exists({str(stop)!r}):
                    try:
                        open({str(final / "marker")!r}).read()
                        reads += 1
                    except FileNotFoundError:
                        missing += 1
                    if not started:
                        started = True
                        print("ready", flush=True)
                print(reads, missing, flush=True)
            """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout.readline().strip() == "ready"
    for n in range(1, 150):
        with io.atomic_directory(final, overwrite=True) as tmp:
            filled(tmp, str(n))
    stop.touch()
    reads, missing = map(int, reader.stdout.readline().split())
    reader.wait(timeout=30)
    assert reads > 0 and missing == 0, (reads, missing)
    assert (final / "marker").read_text() == "149"


def test_exchange_paths_swaps_two_files_and_names_a_missing_one(tmp_path):
    if io._renameat2() is None:
        pytest.skip("this libc has no renameat2")
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A")
    b.write_text("B")
    assert io.exchange_paths(a, b) is True
    assert (a.read_text(), b.read_text()) == ("B", "A")
    with pytest.raises(FileNotFoundError) as error:
        io.exchange_paths(a, tmp_path / "missing")
    assert str(tmp_path / "missing") in str(error.value)


def test_a_failed_body_leaves_the_old_folder_and_nothing_beside_it(tmp_path):
    final = tmp_path / "index"
    with io.atomic_directory(final) as tmp:
        filled(tmp, "old")
    with pytest.raises(RuntimeError), io.atomic_directory(final, overwrite=True) as tmp:
        filled(tmp, "new")
        raise RuntimeError("disk full")
    assert (final / "marker").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["index"]
