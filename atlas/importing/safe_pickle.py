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
import io
import pathlib
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from tasks.io import InputError

# What the reference stores besides tensors and containers: its options (`opt`, an argparse
# Namespace) whose path-valued options may be pathlib paths.
ALLOWED_GLOBALS: tuple[type, ...] = (
    argparse.Namespace,
    pathlib.PosixPath,
    pathlib.PurePosixPath,
    pathlib.WindowsPath,
    pathlib.PureWindowsPath,
)


class UnsafePickleError(InputError):
    """A pickle that asks for a global outside the allow-list (it is never executed)."""


def _allowed_names() -> str:
    return ", ".join(f"{g.__module__}.{g.__qualname__}" for g in ALLOWED_GLOBALS)


def _refused_global(message: str) -> str:
    match = re.search(r"GLOBAL ([\w.]+)", message) or re.search(r"global[: ]+'?([\w.]+)", message)
    return match.group(1) if match else "a global"


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
    use_mmap = mmap and zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(list(ALLOWED_GLOBALS)):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=use_mmap)
    except pickle.UnpicklingError as e:
        message = str(e)
        if "GLOBAL" in message or "global" in message:
            raise UnsafePickleError(
                path, None, None,
                f"refused to unpickle: it asks for {_refused_global(message)}, which is not in the allow-list "
                f"({_allowed_names()}, tensors and plain containers); nothing from it was executed") from None
        raise InputError(path, None, None, f"not a readable torch file ({message.splitlines()[0][:200]})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise InputError(path, None, None,
                         f"truncated or not a torch file ({str(e).splitlines()[0][:200]})") from None


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Builds only what pickle opcodes build themselves: refuses every global lookup."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")


def load_plain_pickle(path: str | Path) -> Any:
    """Unpickle a plain pickle of dicts/lists/strings/numbers (Atlas's `passages.{i}.pt`).

    A torch zip file is read with `load_torch_file` instead. Raises `InputError` naming the
    file when it is missing or truncated, `UnsafePickleError` when it names any global.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, None, "file not found")
    if zipfile.is_zipfile(path):
        return load_torch_file(path, mmap=False)
    try:
        with open(path, "rb") as f:
            return _NoGlobalsUnpickler(io.BufferedReader(f)).load()
    except pickle.UnpicklingError as e:
        message = str(e)
        if message.startswith("GLOBAL "):
            raise UnsafePickleError(
                path, None, None,
                f"refused to unpickle: it asks for {message[7:]}, and a passages file may hold only "
                "lists, dicts, strings and numbers; nothing from it was executed") from None
        raise InputError(path, None, None, f"not a readable pickle ({message[:200]})") from None
    except (EOFError, ValueError, TypeError, IndexError, AttributeError, MemoryError) as e:
        raise InputError(path, None, None, f"truncated or not a pickle ({type(e).__name__}: {e})"[:300]) from None
