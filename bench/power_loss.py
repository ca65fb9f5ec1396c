"""What a folder would hold after a power cut: record what a process made durable, then rebuild only that.

A SIGKILL leaves the page cache intact, so everything a killed process wrote is still read back; a power cut
keeps only what reached the disk. This module models the file system that keeps the least POSIX allows: a file's
data survives as of its last `fsync`, a folder's names (creates, renames, deletes) as of the folder's last
`fsync`, and nothing else. That is what ext4 can leave (`data=writeback`, or delayed allocation: a renamed file
whose data never reached the disk reads empty) and XFS (the file's size kept, its data zeros); a journaled
`data=ordered` ext4 usually keeps more, never less.

How it is recorded, in the child process only, with no kernel help (no FUSE mount, no LD_PRELOAD):
- `os.fsync` / `os.fdatasync` (and `numpy.memmap.flush`, an msync) are wrapped. At each call the wrapper reads
  what the file holds now through `/proc/self/fd/N` (the page cache: whatever wrote it, Python, C code such as
  FAISS or safetensors, or a memory map), copies it to the journal, calls the real fsync, and only then appends
  one line to the journal's log:
  an fsync cut short by the kill was never promised. For a folder it records its names and their inodes.
- Deletions and renames are wrapped only to keep the inode they free open (an `O_PATH` fd), so the kernel does
  not hand the same inode number to a new file while the durable state may still name the old one.
Blind spot: an fsync made from C code is not seen, so the rebuild drops data the program did make durable
(a false failure, never a false pass); atlas makes every commit's fsyncs from Python (`common/io.py`,
`retriever/index_files.py`).

After the kill, `rebuild` writes the folder as the power cut would leave it: the names each folder had at its
last fsync (or at the start, never fsync'd since), each file's data at its last fsync (or at the start), and a
file that was never fsync'd and did not exist before either empty or zero-filled to its size (drawn per trial).

    python bench/power_loss.py --journal J --root R -- index update --index R/index ...   (the child's entry)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = "log"


def _entries(fd_or_path) -> dict[str, list]:
    """A folder's names → [inode, is a folder] (symbolic links are recorded as files and not followed)."""
    with os.scandir(fd_or_path) as it:
        return {e.name: [e.inode(), e.is_dir(follow_symlinks=False)] for e in it}


class Journal:
    """The child's record: `log` (one JSON line per completed fsync) and the file contents it names."""

    def __init__(self, folder: Path, root: Path):
        self.folder, self.root = folder, str(root.resolve())
        self.fd = os.open(folder / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.seq = 0
        self.pinned: list[int] = []

    def record(self, fd: int) -> str | None:
        """The log line for an fsync of `fd` about to happen (None: outside the root, or a deleted file)."""
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not (path == self.root or path.startswith(self.root + os.sep)):
            return None
        info = os.fstat(fd)
        self.seq += 1
        if stat.S_ISDIR(info.st_mode):
            return json.dumps({"seq": self.seq, "dir": info.st_ino, "entries": _entries(path)})
        if not stat.S_ISREG(info.st_mode):
            return None
        blob = self.folder / f"blob-{self.seq}"
        with open(f"/proc/self/fd/{fd}", "rb") as source, open(blob, "wb") as copy:
            shutil.copyfileobj(source, copy, 1 << 20)
        return json.dumps({"seq": self.seq, "file": info.st_ino, "blob": blob.name})

    def pin(self, path, dir_fd=None) -> None:
        """Hold the inode at `path` (about to be deleted or replaced) open until the process ends."""
        try:
            self.pinned.append(os.open(path, os.O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd))
        except OSError:
            pass  # nothing there (a rename onto a new name), or a symbolic link: no inode of ours to keep


def install(journal: Journal) -> None:
    """Wrap the `os` functions described above, in this process."""
    real = {
        name: getattr(os, name) for name in ("fsync", "fdatasync", "unlink", "remove", "rmdir", "rename", "replace")
    }

    def syncer(name):
        def sync(fd):
            fd = fd if isinstance(fd, int) else fd.fileno()
            line = journal.record(fd)
            real[name](fd)
            if line is not None:
                os.write(journal.fd, (line + "\n").encode())

        return sync

    def deleter(name):
        def delete(path, *, dir_fd=None):
            journal.pin(path, dir_fd)
            return real[name](path, dir_fd=dir_fd)

        return delete

    def renamer(name):
        def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
            journal.pin(dst, dst_dir_fd)
            return real[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

        return rename

    os.fsync, os.fdatasync = syncer("fsync"), syncer("fdatasync")
    import numpy  # a memory map's flush is msync(MS_SYNC): it makes the file's data durable as fsync does

    real_flush = numpy.memmap.flush

    def flush(self):
        real_flush(self)
        if getattr(self, "filename", None):
            fd = os.open(self.filename, os.O_RDONLY)
            try:
                line = journal.record(fd)
                if line is not None:
                    os.write(journal.fd, (line + "\n").encode())
            finally:
                os.close(fd)

    numpy.memmap.flush = flush
    os.unlink, os.remove, os.rmdir = deleter("unlink"), deleter("remove"), deleter("rmdir")
    os.rename, os.replace = renamer("rename"), renamer("replace")


def snapshot(root: Path, journal: Path) -> None:
    """Record `root` as it stands before the child starts (taken as durable): folders' names, files' data."""
    journal.mkdir(parents=True)
    dirs, files = {}, {}
    (journal / "initial").mkdir()
    for here, _, names in os.walk(root):
        dirs[os.stat(here).st_ino] = _entries(here)
        for name in names:
            path = Path(here) / name
            if path.is_file() and not path.is_symlink():
                ino = path.stat().st_ino
                shutil.copyfile(path, journal / "initial" / str(ino))
                files[ino] = f"initial/{ino}"
    record = {"root": os.stat(root).st_ino, "dirs": dirs, "files": files}
    (journal / "initial.json").write_text(json.dumps(record))


def rebuild(root: Path, journal: Path, into: Path, rng: random.Random) -> dict:
    """Write at `into` what `root` would hold after a power cut now; → what was kept (for the trial's record)."""
    initial = json.loads((journal / "initial.json").read_text())
    dirs = {int(k): v for k, v in initial["dirs"].items()}
    files = {int(k): journal / v for k, v in initial["files"].items()}
    synced = 0
    for line in (journal / LOG).read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            break  # the line the kill cut short: that fsync had not returned
        synced += 1
        if "dir" in event:
            dirs[event["dir"]] = event["entries"]
        else:
            files[event["file"]] = journal / event["blob"]
    live_sizes = {}
    for here, _, names in os.walk(root):
        for name in names:
            info = os.lstat(Path(here) / name)
            live_sizes[info.st_ino] = info.st_size
    unsynced = rng.choice(["empty", "zeros"])
    lost = []

    def write(ino: int, folder: Path) -> None:
        folder.mkdir()
        for name, (child, is_dir) in dirs.get(ino, {}).items():
            if is_dir:
                write(child, folder / name)
            elif child in files:
                shutil.copyfile(files[child], folder / name)
            else:
                size = live_sizes.get(child, 0) if unsynced == "zeros" else 0
                with open(folder / name, "wb") as f:
                    f.truncate(size)  # a sparse file reads as zeros
                lost.append(str((folder / name).relative_to(into)))

    write(initial["root"], into)
    return {"fsyncs": synced, "never_synced_files": unsynced, "files_without_data": sorted(lost)}


def power_cut(root: Path, journal: Path, rng: random.Random) -> dict:
    """Replace `root` by what a power cut would leave of it (the live tree is deleted)."""
    rebuilt = root.with_name(root.name + ".after-power-cut")
    kept = rebuild(root, journal, rebuilt, rng)
    shutil.rmtree(root)
    os.rename(rebuilt, root)
    return kept


def main() -> None:
    """The child: install the recording layer, then run `atlas ARGS` in this process."""
    import resource
    import runpy

    # every deleted or replaced inode stays open until the end (Journal.pin): allow as many fds as we may
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    args = sys.argv[1:]
    split = args.index("--")
    options = dict(zip(args[:split:2], args[1:split:2], strict=True))
    sys.path.insert(0, str(ROOT))
    install(Journal(Path(options["--journal"]), Path(options["--root"])))
    sys.argv = ["atlas", *args[split + 1 :]]
    runpy.run_module("atlas", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
