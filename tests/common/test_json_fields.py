"""The typed field reader every manifest reads through: each field checked, errors of the record's own class
naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.json_fields import JsonFields, read_json

WHERE = Path("some/record.json")


class RecordError(ValueError):
    pass


def fields(data) -> JsonFields:
    return JsonFields(data, WHERE, error=RecordError)


def test_fields_read_with_their_types_and_defaults():
    record = fields({"n": 3, "name": "x", "flag": False, "tags": ["a", "b"], "inner": {"k": 1}, "none": None})
    assert record.count("n") == 3 and record.get("name", str) == "x" and record.get("flag", bool) is False
    assert record.items("tags", str) == ["a", "b"] and record.get("absent", int, 7) == 7
    assert record.get("none", str, optional=True) is None and record.object("none") is None
    assert record.object("inner").count("k") == 1 and record.object("inner").name("k") == "inner.k"


@pytest.mark.parametrize(
    ("read", "message"),
    [
        (lambda f: f.get("absent", int), "field absent is missing"),
        (lambda f: f.get("n", str), "field n must be a string, got 3"),
        (lambda f: f.count("flag"), "field flag must be an integer, got True"),  # a bool is not a number
        (lambda f: f.count("minus"), "field minus must be >= 0, got -1"),
        (lambda f: f.choice("name", ("a", "b")), r"field name must be one of \('a', 'b'\), got 'x'"),
        (lambda f: f.items("tags", str), r"field tags\[1\] must be a string, got 2"),
        (lambda f: f.object("inner").get("k", str), "field inner.k must be a string, got 1"),
        (lambda f: f.object("list"), "field list must be an object, got"),
    ],
)
def test_a_bad_field_is_an_error_of_the_records_class_naming_file_and_field(read, message):
    record = fields({"n": 3, "flag": True, "minus": -1, "name": "x", "tags": ["a", 2], "inner": {"k": 1}, "list": [1]})
    with pytest.raises(RecordError, match=f"^some/record.json: {message}"):
        read(record)


def test_a_record_that_is_not_an_object_or_not_json_is_named(tmp_path):
    with pytest.raises(RecordError, match=r"^some/record.json: field manifest must be an object, got \[1\]"):
        fields([1])
    path = tmp_path / "record.json"
    path.write_text("{not json")
    with pytest.raises(RecordError, match=r"record.json: corrupted corpus manifest \(Expecting"):
        read_json(path, RecordError, "corpus manifest")
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(RecordError, match="corrupted manifest"):
        read_json(path, RecordError)
