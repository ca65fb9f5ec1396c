"""Loading the reference implementations' pickles without executing pickled code.

Atlas and FiD save with `torch.save` (a zip of tensors plus a pickle that may name any Python
callable) and, for passages, with plain `pickle.dump`. Unpickling such a file from elsewhere
can run arbitrary code, so both are read by unpicklers that resolve only an explicit
allow-list of globals: `torch.load(weights_only=True)` (tensors, containers, scalars) plus
`ALLOWED_GLOBALS` for torch files, and nothing at all beyond the pickle opcodes' own types
(dict, list, str, numbers, None) for plain pickles. Anything else is refused with an
`UnsafePickleError` that names the file and the global it asked for.
"""

from __future__ import annotations

import argparse
import pathlib
import pickle
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

from common.io import InputError

# What the reference stores besides tensors and containers: its options (`opt`, an argparse
# Namespace of strings and numbers; `opt.device`, a torch.device, is allowed by torch itself).
# POSIX paths are value types a fork's Path-typed options would add; building one runs nothing.
ALLOWED_GLOBALS: tuple[type, ...] = (argparse.Namespace, pathlib.PosixPath, pathlib.PurePosixPath)

# What a truncated or damaged pickle raises from deep inside the unpicklers (torch's legacy
# format: IndexError, AssertionError on a storage key, struct.error; a zip: BadZipFile; a
# FRAME length: OverflowError): all mean "not a readable file", never a crash.
_DAMAGED = (
    EOFError,
    OSError,
    RuntimeError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    AssertionError,
    OverflowError,
    MemoryError,
    struct.error,
    zipfile.BadZipFile,
)


class UnsafePickleError(InputError):
    """A pickle that asks for a global outside the allow-list (it is never executed)."""


def _refused_global(message: str) -> str | None:
    """The global an unpickler refused (its message says `GLOBAL module.name`), else None (a
    damaged file can cut a name short: `GLOBAL .` is no global)."""
    match = re.search(r"GLOBAL ([A-Za-z_][\w.]*\.[A-Za-z_]\w*)", message)
    return match.group(1) if match else None


def _reason(error: BaseException) -> str:
    """The cause of a failed load in a few words: torch's weights-only message without its advice
    to retry with `weights_only=False` (which would run the file's pickled code)."""
    message = str(error)
    if "WeightsUnpickler error:" in message:
        message = message.split("WeightsUnpickler error:", 1)[1]
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:200]


def _is_zip(path: Path) -> bool:
    """Whether `path` ends like a zip file (torch's format since 1.6); a zip end record that
    `zipfile` rejects is a damaged file."""
    try:
        return zipfile.is_zipfile(path)
    except zipfile.BadZipFile as e:
        raise InputError(path, None, None, f"truncated or not a torch file ({_reason(e)})") from None


def load_torch_file(path: str | Path, *, mmap: bool = True) -> Any:
    """`torch.load` a reference file with `weights_only=True` and the `ALLOWED_GLOBALS`, on CPU.

    `mmap`: map the tensors of a zip-format file instead of reading them (a checkpoint's
    optimizer state need not be read to import its weights; legacy files are read whole).
    Raises `InputError` naming the file when it is missing, truncated or not a torch file,
    and `UnsafePickleError` when it asks for any global outside the allow-list.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, None, "file not found")
    use_mmap = mmap and _is_zip(path)
    try:
        with torch.serialization.safe_globals(list(ALLOWED_GLOBALS)):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=use_mmap)
    except (pickle.UnpicklingError, *_DAMAGED) as e:
        refused = _refused_global(str(e)) if isinstance(e, pickle.UnpicklingError) else None
        if refused is not None:
            allowed = ", ".join(f"{g.__module__}.{g.__qualname__}" for g in ALLOWED_GLOBALS)
            raise UnsafePickleError(
                path,
                None,
                None,
                f"refused to unpickle: it asks for {refused}, which is not in the allow-list "
                f"({allowed}, tensors and plain containers); nothing from it was executed",
            ) from None
        raise InputError(path, None, None, f"truncated or not a torch file ({_reason(e)})") from None


class _RefusedGlobal(pickle.UnpicklingError):
    """Raised by `_NoGlobalsUnpickler` for the first global a pickle asks for."""


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Builds only what pickle opcodes build themselves: refuses every global lookup."""

    def find_class(self, module: str, name: str):
        raise _RefusedGlobal(f"{module}.{name}")


def load_plain_pickle(path: str | Path) -> Any:
    """Unpickle a plain pickle of dicts/lists/strings/numbers (Atlas's `passages.{i}.pt`).

    A torch zip file is read with `load_torch_file` instead. Raises `InputError` naming the
    file when it is missing or truncated, `UnsafePickleError` when it names any global.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, None, "file not found")
    if _is_zip(path):
        return load_torch_file(path, mmap=False)
    try:
        with open(path, "rb") as f:
            return _NoGlobalsUnpickler(f).load()
    except _RefusedGlobal as e:
        raise UnsafePickleError(
            path,
            None,
            None,
            f"refused to unpickle: it asks for {str(e)[:200]}, and a passages file may hold only "
            "lists, dicts, strings and numbers; nothing from it was executed",
        ) from None
    except pickle.UnpicklingError as e:
        raise InputError(path, None, None, f"not a readable pickle ({_reason(e)})") from None
    except _DAMAGED as e:
        raise InputError(path, None, None, f"truncated or not a pickle ({type(e).__name__}: {_reason(e)})") from None
