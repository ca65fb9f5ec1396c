"""The type rules of a recipe, in one place: a settings section is a pydantic dataclass that refuses unknown keys
and checks each value strictly against its annotation (no "10" for an int, no 1 for a bool, no 2.0 for an int),
with the two leniencies YAML needs: a float may be written as a string (YAML 1.1 reads `4e-5` as one), and a str
may be written as a number (`spec: 123`, `output_dir: 2024`). A section left empty (`training:` alone) keeps its
defaults.

Sections stay dataclasses (`dataclasses.replace`, `dataclasses.fields` and equality work as before), and the
source keeps plain annotations (`lr: float`), which the configuration reference prints."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import types
import typing
from typing import Annotated, Any, Literal, Union

import pydantic
import pydantic.dataclasses
from pydantic import BeforeValidator, ConfigDict, Strict, TypeAdapter

SECTION_CONFIG = ConfigDict(extra="forbid")


def _float_from_text(value: Any) -> Any:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    return value


def _text_from_number(value: Any) -> Any:
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _section_or_defaults(value: Any) -> Any:
    return {} if value is None else value


def checked_type(tp: Any) -> Any:
    """The annotation `tp` as pydantic checks it in a recipe (the module's rules), inside unions and lists too."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return Union[tuple(checked_type(arg) for arg in args)]  # noqa: UP007  (built from a tuple of types)
    if origin is list:
        return list[checked_type(args[0])]
    if tp is float:
        return Annotated[float, Strict(), BeforeValidator(_float_from_text)]
    if tp is str:
        return Annotated[str, Strict(), BeforeValidator(_text_from_number)]
    if tp in (int, bool):
        return Annotated[tp, Strict()]
    if dataclasses.is_dataclass(tp):
        return Annotated[tp, BeforeValidator(_section_or_defaults)]
    return tp


def config_section(cls: type | None = None, /, **options: Any) -> Any:
    """Make `cls` a settings section: a pydantic dataclass under the module's rules (`options`: dataclass options,
    `frozen=True`). Its annotations must resolve where it is defined (the sections it holds defined first)."""

    def make(cls: type) -> type:
        hints = typing.get_type_hints(cls)
        cls.__annotations__ = {name: checked_type(hints[name]) for name in cls.__annotations__}
        return pydantic.dataclasses.dataclass(cls, config=SECTION_CONFIG, **options)

    return make(cls) if cls is not None else make


@functools.cache
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(checked_type(tp))


def check_value(value: Any, tp: Any) -> Any:
    """`value` checked and converted as a section field annotated `tp` would be (`pydantic.ValidationError` if
    it cannot be)."""
    return _adapter(tp).validate_python(value)


def type_text(tp: Any) -> str:
    """How an error names what a value must be: `int`, `one of 'fp32', 'bf16'`, `a list`, `a mapping`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        named = [arg for arg in args if arg is not type(None)]
        return type_text(named[0]) if len(named) == 1 else " | ".join(type_text(arg) for arg in named)
    if origin is Literal:
        return "one of " + ", ".join(repr(arg) for arg in args)
    if origin is list:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


@dataclasses.dataclass(frozen=True)
class SectionError:
    """One refused value: its dotted key (`training.steps`, `task.train_data[1]`), and what is wrong with it
    (`unknown key …`, `'training.steps' must be int, got 'ten'`) without where it came from."""

    key: str
    message: str


def first_error(error: pydantic.ValidationError, root: Any, prefix: str = "") -> SectionError:
    """The error of `error` a reader meets first in `root`'s schema (a section's unknown keys before its fields,
    fields in their order), in the words recipe errors use. `prefix`: the dotted key of `root` itself."""
    described = [_describe(details, root, prefix) for details in error.errors()]
    return min(described, key=lambda pair: pair[0])[1]


def _describe(details: dict, root: Any, prefix: str) -> tuple[tuple, SectionError]:
    """(where the error sits in schema order, the error) for one of pydantic's error records."""
    tp, key, order = root, prefix, []
    loc = list(details["loc"])
    while loc:
        step = loc[0]
        hints = typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        if isinstance(step, str) and step in hints:
            order.append((1, [f.name for f in dataclasses.fields(tp)].index(step)))
            tp, key = hints[step], f"{key}.{step}" if key else step
        elif isinstance(step, int) and typing.get_origin(_optional(tp)) is list:
            order.append((1, step))
            tp, key = typing.get_args(_optional(tp))[0], f"{key}[{step}]"
        elif details["type"] == "unexpected_keyword_argument" and len(loc) == 1 and isinstance(step, str):
            order.append((0, step))  # a section's unknown keys are named before its fields' values
            unknown = f"{key}.{step}" if key else step
            valid = ", ".join(sorted(f.name for f in dataclasses.fields(tp)))
            return tuple(order), SectionError(unknown, f"unknown key '{unknown}' (valid keys: {valid})")
        else:
            break  # a union member's tag or a validator's name: the field is the one reached
        loc.pop(0)
    value = details["input"]
    if dataclasses.is_dataclass(_optional(tp)):
        return tuple(order), SectionError(key, f"'{key or 'config'}' must be a mapping, got {value!r}")
    return tuple(order), SectionError(key, f"'{key}' must be {type_text(tp)}, got {value!r}")


def _optional(tp: Any) -> Any:
    """`X` for `X | None`; else `tp`."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        named = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return named[0] if len(named) == 1 else tp
    return tp
