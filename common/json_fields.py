"""Typed reading of the JSON records atlas writes beside its data (an index's `manifest.json`, a corpus's
`corpus.json`, a kNN-LM datastore's `manifest.json`): one style for all of them.

`read_json(path, error)` parses a file; `JsonFields(data, path, error=...)` reads one JSON object of it, each field
checked for its type, and every error names the file and the field (`segments[1].count`). The error class is the
record's own (`InvalidIndexError` for an index, …), so a caller catches what it caught before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_KIND_NAMES = {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "an object"}


def read_json(path: Path, error: type[Exception], what: str = "manifest") -> Any:
    """The parsed JSON of the file `path`; `error` ("PATH: corrupted WHAT (why)") where it is not JSON."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: corrupted {what} ({e})") from None


class JsonFields:
    """Reads the fields of one JSON object of the file `where`, each checked for its type; errors (of the class
    `error`) name the file and the field, `prefix` + the key (`segments[1].count`; "" at the top level)."""

    def __init__(self, data: Any, where: Path, prefix: str = "", *, error: type[Exception] = ValueError):
        if not isinstance(data, dict):
            raise error(f"{where}: field {prefix or 'manifest'} must be an object, got {data!r:.60}")
        self.data, self.where, self.prefix, self.error = data, where, prefix, error

    def name(self, key: str) -> str:
        """The field `key` as errors name it (`segments[1].count`)."""
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, message: str) -> Exception:
        """The error "FILE: field NAME MESSAGE" about the field `key`, to raise."""
        return self.error(f"{self.where}: field {self.name(key)} {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, optional: bool = False) -> Any:
        """The field `key`, of type `kind` (None too where `optional`); `default` where absent (required if none)."""
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "is missing")
            return default
        value = self.data[key]
        if value is None and optional:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
            raise self.fail(key, f"must be {expected}, got {value!r:.60}")
        return value

    def count(self, key: str, default: Any = ...) -> int:
        """The field `key`, an integer >= 0."""
        value = self.get(key, int, default)
        if value is not None and value < 0:
            raise self.fail(key, f"must be >= 0, got {value}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> str:
        """The field `key`, one of the strings `choices`."""
        value = self.get(key, str, default)
        if value not in choices:
            raise self.fail(key, f"must be one of {choices}, got {value!r}")
        return value

    def items(self, key: str, kind: type, default: Any = ...) -> list:
        """The field `key`, a list whose every item is of type `kind` (errors name the item: `sources[2]`)."""
        values = self.get(key, list, default)
        for i, value in enumerate(values or ()):
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise self.fail(f"{key}[{i}]", f"must be {_KIND_NAMES.get(kind, kind.__name__)}, got {value!r:.60}")
        return values

    def object(self, key: str) -> JsonFields | None:
        """The fields of the object `key`; None where it is absent or null."""
        if self.data.get(key) is None:
            return None
        return JsonFields(self.data[key], self.where, self.name(key), error=self.error)

    def settings(self, key: str, cls: type, **kinds: type) -> Any:
        """`cls` of the fields `kinds` of the object `key` (each optional: None where absent); `cls()` without it."""
        fields = self.object(key)
        return cls(**{k: fields.get(k, kind, None, optional=True) for k, kind in kinds.items()}) if fields else cls()
