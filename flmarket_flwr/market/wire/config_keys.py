"""The one check of a config value, shared by the run-config schema (the app's) and the node-config schema.

A key's type is its default's (an int is accepted for a float key); a check says whether a well-typed value can
work. Errors name the config, the key and the value, and what the value must be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, cast

__all__ = ["ConfigKind", "Scalar", "at_least", "check_value", "one_of", "positive", "typed_value"]

Scalar = bool | int | float | str
ConfigKind = Literal["run", "node"]
"""Which config a key belongs to: Flower's ``--run-config`` or a SuperNode's ``--node-config``."""


def positive(value: float) -> bool:
    """Whether ``value > 0``."""
    return value > 0


def at_least(low: int) -> Callable[[int], bool]:
    """A check: ``value >= low``."""
    return lambda value: value >= low


def one_of(choices: Iterable[str]) -> Callable[[str], bool]:
    """A check: one of ``choices`` (case and ``-``/``_`` ignored)."""
    allowed = tuple(choices)
    return lambda value: value.lower().replace("-", "_") in allowed


def typed_value(config: ConfigKind, name: str, value: Any, kind: type, like: Scalar | None = None) -> Scalar:
    """``value`` as a ``kind`` (an int for a float is fine; a bool is no int), or a ``ValueError`` naming the key.

    Strings come back stripped of surrounding blanks.
    """
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        example = "" if like is None else f", like {like!r}"
        raise ValueError(f"{config}-config key {name}={value!r}: must be a {kind.__name__}{example}")
    return value.strip() if isinstance(value, str) else cast(Scalar, value)


def check_value(config: ConfigKind, name: str, value: Any, check: Callable[[Any], bool] | None, expected: str) -> None:
    """``ValueError`` naming the key unless ``check`` (if any) accepts the well-typed ``value``."""
    if check is not None and not check(value):
        raise ValueError(f"{config}-config key {name}={value!r}: must be {expected}; fix it with --{config}-config")
