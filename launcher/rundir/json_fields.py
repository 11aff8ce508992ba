"""Reading a JSON object back into frozen dataclasses, checking every field against its annotation.

For files elfes writes and reads again (``state.json``): a file edited by hand or damaged on disk is
refused with the field, its value and what it should be, never turned into a ``TypeError`` deep in a
caller. Understands the annotations those dataclasses use: ``str``, ``int``, ``bool``, ``float``, ``X | None``,
``tuple[X, ...]``, ``dict[str, X]``, ``Any`` (taken as it is), ``str`` enums (read as their members) and nested
dataclasses. Torch-free.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..errors import EXIT_RUN_DAMAGED, ElfesError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Record = TypeVar("Record", bound="DataclassInstance")


class FieldError(ElfesError, ValueError):
    """A field that does not fit its dataclass; the message names it (``attempts[1].step``). A file elfes wrote
    that holds one is damaged."""

    exit_code = EXIT_RUN_DAMAGED


def _describe(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    kinds = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", type(None): "null"}
    return f"{value!r} ({kinds.get(type(value), type(value).__name__)})"


def read_record(cls: type[Record], data: Any, where: str = "",
                choices: Mapping[str, tuple[str, ...]] | None = None) -> Record:
    """``cls(**data)`` once every field of ``data`` has the type ``cls`` declares (recursively).

    ``choices``: field names (at any depth) whose string value must be one of the given ones.
    Raises :class:`FieldError` naming the first field that does not fit.
    """
    if not isinstance(data, dict):
        raise FieldError(f"{where or 'the content'} is {_describe(data)}, not an object")
    choices = choices or {}
    hints = _type_hints(cls)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise FieldError(f"{where} has unknown field {unknown[0]!r}")
    values = {}
    for field in dataclasses.fields(cls):
        name = f"{where}.{field.name}" if where else field.name
        if field.name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise FieldError(f"{name} is missing")
            continue
        value = _read_value(hints[field.name], data[field.name], name, choices)
        allowed = choices.get(field.name)
        if allowed is not None and value is not None and value not in allowed:
            raise FieldError(f"{name} is {_describe(value)}, not one of {', '.join(allowed)}")
        values[field.name] = value
    return cls(**values)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, worked out once per class: it compiles every annotation string
    (``from __future__ import annotations``) each time, which dominated reading a sweep's 1,000 state.json."""
    return typing.get_type_hints(cls)


def _read_value(hint: Any, value: Any, where: str, choices: Mapping[str, tuple[str, ...]]) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [option for option in typing.get_args(hint) if option is not type(None)]
        if value is None and len(options) < len(typing.get_args(hint)):
            return None
        (hint,) = options
        origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list):
            raise FieldError(f"{where} is {_describe(value)}, not a list")
        item_hint = typing.get_args(hint)[0]
        return tuple(_read_value(item_hint, item, f"{where}[{index}]", choices) for index, item in enumerate(value))
    if hint is Any:
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise FieldError(f"{where} is {_describe(value)}, not an object")
        item_hint = typing.get_args(hint)[1]
        return {key: _read_value(item_hint, item, f"{where}.{key}", choices) for key, item in value.items()}
    if dataclasses.is_dataclass(hint):
        # An annotation names a class, never an instance.
        return read_record(cast("type[DataclassInstance]", hint), value, where, choices)
    if isinstance(hint, type) and issubclass(hint, Enum):
        if not isinstance(value, str):
            raise FieldError(f"{where} is {_describe(value)}, not a string")
        if value not in hint._value2member_map_:
            raise FieldError(f"{where} is {_describe(value)}, not one of {', '.join(hint)}")
        return hint(value)
    if hint is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise FieldError(f"{where} is {_describe(value)}, not an integer")
    if hint is str and not isinstance(value, str):
        raise FieldError(f"{where} is {_describe(value)}, not a string")
    if hint is bool and not isinstance(value, bool):
        raise FieldError(f"{where} is {_describe(value)}, not true or false")
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise FieldError(f"{where} is {_describe(value)}, not a number")
        return float(value)
    if hint not in (int, str, bool):
        raise TypeError(f"{where}: json_fields cannot read the annotation {hint!r}")  # a bug in the caller
    return value
