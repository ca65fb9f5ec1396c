"""The manifest of a prepared corpus folder (`corpus.json`): a typed, versioned record, and the only code that
knows the file's keys. `Corpus.manifest` holds one; `prepare_corpus`, `write_corpus` and `merge_corpora` write one.

Format version 1 (read and written): the content fingerprint (the SHA-256 of `passages.arrow`), the passage count,
the chunking settings, the sources, whether the corpus is a compaction's merge, when it was written, and what
preparing it counted (`stats`, kept as written). Read through `common.json_fields`, as the index's manifest is: a
corrupt or mistyped file is one `InvalidCorpusError` naming the file and the field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.io import atomic_write_json
from common.json_fields import JsonFields, read_json

CORPUS_MANIFEST = "corpus.json"
FORMAT_VERSION = 1


class InvalidCorpusError(ValueError):
    """A corpus folder that cannot be used as it is; the message says which file and why."""


@dataclass
class CorpusManifest:
    """What a prepared corpus folder holds (see the module)."""

    fingerprint: str  # SHA-256 of passages.arrow
    count: int  # passages
    chunk_words: int | None  # words a passage was cut at (0 or less: documents whole)
    stride: int | None  # words between passage starts (None: not chunking)
    sources: list[str]  # where the passages came from (the inputs' resolved paths, a merge's corpora, …)
    created: str | None = None  # UTC, ISO 8601
    stats: dict[str, Any] = field(default_factory=dict)  # `PrepareStats` as preparing counted ({passages}: a merge)
    merged: bool = False  # written by `merge_corpora` (an index compaction)
    format_version: int = FORMAT_VERSION

    @classmethod
    def load(cls, folder: str | os.PathLike) -> CorpusManifest:
        """The manifest of the corpus folder `folder`: FileNotFoundError where there is none, `InvalidCorpusError`
        naming the file and the field where it is corrupt or of a version this atlas does not read."""
        path = Path(folder) / CORPUS_MANIFEST
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder} is not a prepared corpus (no {CORPUS_MANIFEST}); "
                "make one with `atlas corpus prepare INPUT... --out DIR`"
            )
        return cls.from_json(read_json(path, InvalidCorpusError, "corpus manifest"), path)

    def save(self, folder: str | os.PathLike) -> None:
        """Atomically replace the folder's `corpus.json`."""
        atomic_write_json(Path(folder) / CORPUS_MANIFEST, self.to_json())

    @classmethod
    def from_json(cls, data: Any, where: Path) -> CorpusManifest:
        """A manifest from its parsed JSON `data`, read from the file `where` (named in errors)."""
        fields = JsonFields(data, where, error=InvalidCorpusError)
        version = fields.get("format_version", int)
        if version != FORMAT_VERSION:
            raise fields.fail("format_version", f"is {version}, this atlas reads {FORMAT_VERSION} (a newer atlas's?)")
        return cls(
            fingerprint=fields.get("fingerprint", str),
            count=fields.count("count"),
            chunk_words=fields.get("chunk_words", int, None, optional=True),
            stride=fields.get("stride", int, None, optional=True),
            sources=fields.items("sources", str),
            created=fields.get("created", str, None, optional=True),
            stats=fields.get("stats", dict, {}),
            merged=fields.get("merged", bool, False),
            format_version=version,
        )

    def to_json(self) -> dict:
        """The manifest as `corpus.json` holds it: the keys in the order every atlas has written them."""
        data: dict[str, Any] = {
            "format_version": self.format_version,
            "fingerprint": self.fingerprint,
            "count": self.count,
            "chunk_words": self.chunk_words,
            "stride": self.stride,
            "sources": self.sources,
        }
        if self.merged:
            data["merged"] = True
        return data | {"created": self.created, "stats": self.stats}
