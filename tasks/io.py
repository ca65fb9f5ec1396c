"""Reading input files with precise errors, and writing outputs atomically.

`tasks/` is the bottom layer of atlas, so the few file helpers every other package needs
(the corpus reader, the index, checkpoints) live here: one place that turns a malformed
record into an error naming the file, the line and the field.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `final`; rename it to `final` on success.

    On any exception the temporary directory is removed, so no half-written output is left.
    """
    final = Path(final)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists (use --overwrite to replace it)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and an atomic rename (fsync'd)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 `text` to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike, records) -> int:
    """Write an iterable of dicts as JSON lines, atomically; returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return n
