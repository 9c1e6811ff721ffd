"""Typed rows: what the store hands its callers in place of ORM objects.

A repository module declares its row as a frozen dataclass whose fields are named like the
model's attributes, and reads it off the ORM object with `typed_row`; a caller then holds a
value it can neither lazy-load through nor mutate behind the store's back.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

Row = TypeVar("Row")


def typed_row(kind: type[Row], orm: object, **overrides: Any) -> Row:
    """A `kind` (a dataclass) read off `orm`'s attributes of the same names; `overrides`
    give the fields the model stores otherwise (a NULL that reads as `{}`)."""
    names = _NAMES.get(kind)
    if names is None:
        names = _NAMES[kind] = tuple(field.name for field in fields(kind))  # type: ignore[arg-type]
    values = {name: getattr(orm, name) for name in names if name not in overrides}
    return kind(**values, **overrides)


_NAMES: dict[type[Any], tuple[str, ...]] = {}
