"""Store calls as JSON: the wire format between the socket store (``remote.py``) and the
server that owns the store (``cuectl.serve.storecalls``).

JSON has no tuples, no non-string keys, no dataclasses and no paths, and the store's
methods take and return all of them, so each is tagged: ``{"__tuple": [...]}``,
``{"__dict": [[key, value], ...]}`` (a mapping whose keys are not all plain strings; one
that is, a row, is a JSON object), ``{"__set": [...]}``, ``{"__path": "..."}``,
``{"__float": "inf"}`` and ``{"__dc": "JobSpec", "f": {...}}``. Never pickle: the server
runs as the store's owner (root, or a service account) and decodes what any local user
sends it.

A dataclass is rebuilt only when it is one of ``TYPES``, and on the server (``typed``) every
field is checked against its annotation, so a hostile client gets one clear error, never
a ``JobSpec`` whose command is a mapping or whose frame number is a string that a worker
running as root would trip over later.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import KeysView, ValuesView
from pathlib import Path, PurePath
from typing import Any, Mapping

from cuectl.errors import InvalidInput
from cuectl.sched import model as m
from cuectl.sched.store import base
from cuectl.sched.usage_sql import UsageGroup

MAX_DEPTH = 64  # a JobSpec nests about 6 levels: deeper is refused, never a RecursionError


def _types() -> dict[str, type]:
    classes: tuple[type, ...] = (
        m.JobSpec,
        m.LayerSpec,
        m.Notify,
        m.Dependency,
        base.HostInfo,
        base.FrameResult,
        base.LiveUsage,
        base.GpuEvent,
        base.DeviceState,
        base.Token,
        base.Actor,
        base.FarmFigures,
        base.ClaimedFrame,
        base.RunnableLayer,
        base.HostShape,
        UsageGroup,
    )
    return {cls.__name__: cls for cls in classes}


#: The dataclasses that may cross the wire, by name.
TYPES: dict[str, type] = _types()


def encode(value: Any) -> Any:
    """``value`` as plain JSON data (tagged where JSON has no such type)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float": repr(value)}
    if isinstance(value, (list, range, types.GeneratorType, KeysView, ValuesView)):
        return [encode(v) for v in value]  # an Iterable or Sequence argument, as a list
    if isinstance(value, tuple):
        return {"__tuple": [encode(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"__set": [encode(v) for v in sorted(value, key=repr)]}
    if isinstance(value, Mapping):
        # Most are rows: string keys, sent as a JSON object (a tenth of the cost of pairs
        # for a 1,000-row list). Other keys, or one that looks like a tag, go as pairs.
        if all(type(k) is str and not k.startswith("__") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"__dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, PurePath):
        return {"__path": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value).__name__ in TYPES:
        return {
            "__dc": type(value).__name__,
            "f": {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)},
        }
    raise TypeError(f"cannot send a {type(value).__name__} to the store")


def decode(data: Any, *, typed: bool = False, depth: int = 0) -> Any:
    """The value ``encode`` made. ``typed``: check each dataclass field against its
    annotation (the server, decoding what a client sent)."""
    if depth > MAX_DEPTH:
        raise InvalidInput(f"a store call nests deeper than {MAX_DEPTH} levels")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v, typed=typed, depth=depth + 1) for v in data]
    if not isinstance(data, dict):
        raise InvalidInput(f"a store call holds a value of no known form: {_short(data)}")
    if set(data) == {"__dc", "f"}:
        return _dataclass(data, typed=typed, depth=depth)
    if not any(k.startswith("__") for k in data):  # a row: an object of string keys
        return {k: decode(v, typed=typed, depth=depth + 1) for k, v in data.items()}
    if len(data) != 1:
        raise InvalidInput(f"a store call holds a value of no known form: {_short(data)}")
    ((tag, inner),) = data.items()
    if tag == "__float" and inner in ("inf", "-inf", "nan"):
        return float(inner)
    if tag == "__path" and isinstance(inner, str):
        return Path(inner)
    if not isinstance(inner, list):
        raise InvalidInput(f"a store call holds a value of no known form: {_short(data)}")
    items = [decode(v, typed=typed, depth=depth + 1) for v in inner]
    if tag == "__tuple":
        return tuple(items)
    if tag == "__set":
        return frozenset(items)
    if tag == "__dict" and all(isinstance(p, list) and len(p) == 2 for p in items):
        return {_hashable(k): v for k, v in items}
    raise InvalidInput(f"a store call holds a value of no known form: {_short(data)}")


def loads(raw: bytes | str) -> Any:
    """Parse and decode a server's answer in one pass of the C parser: tags are turned back
    into values as each object is read (a client trusts its server: no type checks). A
    1,000-row list took a third of the time of parsing and then walking it."""
    return json.loads(raw, object_hook=_untag)


def _untag(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        ((tag, inner),) = obj.items()
        if tag == "__tuple":
            return tuple(inner)
        if tag == "__set":
            return frozenset(inner)
        if tag == "__dict":
            return {_hashable(k): v for k, v in inner}
        if tag == "__path":
            return Path(inner)
        if tag == "__float":
            return float(inner)
    elif len(obj) == 2 and "__dc" in obj and "f" in obj:
        cls = TYPES.get(obj["__dc"])
        if cls is None:
            raise InvalidInput(f"the server sent an object of no known kind: {_short(obj['__dc'])}")
        return cls(**obj["f"])
    return obj


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict)):
        raise InvalidInput(f"a store call holds a mapping key of no usable form: {_short(key)}")
    return key


def _dataclass(data: Mapping[str, Any], *, typed: bool, depth: int) -> Any:
    cls = TYPES.get(str(data.get("__dc")))
    fields = data.get("f")
    if cls is None or not isinstance(fields, dict):
        raise InvalidInput(f"a store call holds an object of no known kind: {_short(data.get('__dc'))}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise InvalidInput(f"{cls.__name__}: unknown field {unknown[0]!r}")
    values = {name: decode(v, typed=typed, depth=depth + 1) for name, v in fields.items()}
    if typed:
        hints = typing.get_type_hints(cls)
        for name, value in values.items():
            if not _fits(value, hints.get(name, Any)):
                raise InvalidInput(f"{cls.__name__}.{name}: {_short(value)} is not a {_hint_text(hints[name])}")
    try:
        return cls(**values)
    except TypeError as exc:  # a required field missing
        raise InvalidInput(f"{cls.__name__}: {exc}") from None


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type ``hint`` (the forms the store's records
    use: scalars, unions, Literal, tuples, sequences, mappings, frozensets, dataclasses)."""
    if hint is Any or hint is object:
        return True
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type) and origin is None:
        return isinstance(value, hint)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return len(args) == len(value) and all(_fits(v, a) for v, a in zip(value, args))
    if origin in (list, typing.Sequence, _abc("Sequence")):
        return isinstance(value, (list, tuple)) and all(_fits(v, args[0]) for v in value) if args else True
    if origin in (frozenset, set):
        return isinstance(value, frozenset) and all(_fits(v, args[0]) for v in value)
    if origin in (dict, typing.Mapping, _abc("Mapping")):
        return isinstance(value, dict) and (
            not args or all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
        )
    return False  # an annotation this checker does not know: refuse rather than trust


def _abc(name: str) -> Any:
    import collections.abc

    return getattr(collections.abc, name)


def _hint_text(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("cuectl.sched.model.", "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
