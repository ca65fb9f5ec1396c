"""Reading input files with precise errors, and writing outputs atomically and durably.

`tasks/` is the bottom layer of atlas, so the few file helpers every other package needs
(the corpus reader, the index, checkpoints) live here: one place that turns a malformed
record into an error naming the file, the line and the field.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """A malformed input record: names the file, the 1-based line and the field."""

    def __init__(self, path: str | os.PathLike, line: int | None, field: str | None, message: str):
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


def read_jsonl(
    path: str | os.PathLike, on_error: Callable[[InputError], None] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_number, record)` for every non-blank line of a JSON-lines file.

    Raises `InputError` for invalid UTF-8, invalid JSON, a line that is not a JSON object,
    and an empty file; the error names the file and the 1-based line. With `on_error`, a
    bad line is handed to it instead and reading goes on (a missing or empty file still raises).
    A UTF-8 byte-order mark at the start (what Windows tools write) is read as the encoding's mark, not text.
    """
    path = Path(path)
    if not path.exists():
        where = "" if path.is_absolute() else f" (looked for {path.resolve()}; a recipe's are read beside it first)"
        raise InputError(path, None, None, "file not found" + where)
    seen_any = False
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                error = InputError(path, line_no, None, f"invalid UTF-8 ({e.reason} at byte {e.start})")
                seen_any = True
            else:
                if not line.strip():
                    continue
                seen_any = True
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    error = InputError(path, line_no, None, f"invalid JSON: {e.msg} (column {e.colno})")
                else:
                    if isinstance(record, dict):
                        yield line_no, record
                        continue
                    error = InputError(path, line_no, None, f"expected a JSON object, got {type(record).__name__}")
            if on_error is None:
                raise error
            on_error(error)
    if not seen_any:
        raise InputError(path, None, None, "file is empty")


def require_str(record: dict, key: str, path, line: int, *, optional: bool = False) -> str:
    """Return `record[key]` as a string, or raise `InputError` naming file, line and field.

    Integers are accepted for id-like fields and converted (`{"id": 12}` → `"12"`).
    """
    if key not in record or record[key] is None:
        if optional:
            return ""
        raise InputError(path, line, key, "missing required field")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(path, line, key, f"expected a string, got {type(value).__name__}")
    return str(value)


# ------------------------------------------------------------------------------ durable writes
# A rename is atomic but not durable: after a power cut the folder holds whatever its last fsync recorded, and a
# renamed file holds what was last flushed of it (ext4 may keep the new name over an empty file, XFS over zeros).
# So every commit below is: write, fsync the data, rename, fsync the folder that holds the new name.
AT_FDCWD = -100  # <fcntl.h>: a path relative to the working directory
RENAME_EXCHANGE = 2  # <linux/fs.h>: swap two names in one step; both must exist


def fsync_directory(path: str | os.PathLike) -> None:
    """Make the names in folder `path` durable (a create, rename or delete in it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    """Flush the data of file `path` to disk (however it was written: Python, C code, a memory map)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | os.PathLike) -> None:
    """fsync every file and folder under `folder` (deepest first), then `folder` itself: before it is renamed
    into place, all it holds is on disk. Symbolic links are neither followed nor flushed."""
    for here, _, files in os.walk(folder, topdown=False):
        for name in files:
            path = os.path.join(here, name)
            if not os.path.islink(path):
                fsync_file(path)
        fsync_directory(here)


def fsync_parents(path: Path) -> None:
    """fsync the folder that names `path` and every folder above it: the new name is durable, and so is the way to
    it, however its folders were made (a plain `mkdir` by other code lasts only once its parent is fsync'd; a folder
    with nothing new to flush costs next to nothing)."""
    for folder in Path(path).absolute().parents:
        try:
            fsync_directory(folder)
        except PermissionError:  # a folder above that we may not open: one that has long existed
            return


def make_parents(path: Path) -> None:
    """Create `path`'s missing parent folders, each made durable in its own parent."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    for folder in missing:
        folder.mkdir(exist_ok=True)
        fsync_directory(folder.parent)


@functools.cache
def _renameat2() -> Callable | None:
    """libc's `renameat2` (glibc 2.28+, Linux 3.15+), or None on a system without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def exchange_paths(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the names `a` and `b` in one step (`renameat2(RENAME_EXCHANGE)`): at every moment each name holds
    one of the two. → False, changing nothing, where the system or the file system cannot (then the caller
    falls back); any other failure raises `OSError`."""
    function = _renameat2()
    if function is None:
        return False
    if function(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # old kernel, or a file system without it
        return False
    raise OSError(code, os.strerror(code), os.fspath(a), None, os.fspath(b))


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `final`; on success make everything in it durable and put it at
    `final` in one step, durably (the folders above fsync'd after the rename).

    With `overwrite`, an existing `final` is swapped for the new folder in one step where Linux allows it
    (`renameat2(RENAME_EXCHANGE)`): a reader, or a power cut, finds the old folder or the new one at `final`,
    never neither. Elsewhere (another system, a file system without it) the old folder is renamed aside first,
    and put back if the second rename fails: between the two renames `final` is briefly absent.
    On any exception the temporary directory is removed, so no half-written output is left.
    """
    final = Path(final)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists (use --overwrite to replace it)")
    make_parents(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists() and exchange_paths(tmp, final):
        fsync_parents(final)  # the swap is durable before the old folder goes
        shutil.rmtree(tmp, ignore_errors=True)  # now the old folder
        fsync_directory(final.parent)  # else a power cut would bring the old copy back beside the new
    elif final.exists():
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.rename(final, trash)
        try:
            os.rename(tmp, final)
        except BaseException:
            os.rename(trash, final)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_parents(final)
        shutil.rmtree(trash, ignore_errors=True)
        fsync_directory(final.parent)
    else:
        os.rename(tmp, final)
        fsync_parents(final)


@contextlib.contextmanager
def _atomic_file(path: str | os.PathLike, mode: str, **open_args) -> Iterator:
    """An open temporary file beside `path` that becomes `path` by an atomic rename once the block ends, durably
    (file and folder fsync'd); removed, and `path` left as it was, when the block raises."""
    path = Path(path)
    make_parents(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_args) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_parents(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and an atomic rename, durably (file and folder fsync'd)."""
    with _atomic_file(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 `text` to `path` atomically and durably."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically and durably."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike, records) -> int:
    """Write an iterable of dicts as JSON lines, atomically and durably; returns the number written."""
    n = 0
    with _atomic_file(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n
