"""Decoding torch's serialized-program JSON into its schema dataclasses, planned once per type.

torch turns a program's JSON (``models/<name>.json``, the weights and constants configs) into
the dataclasses of its serializer's schema with one recursive function that, for every value,
works out again what its declared type is: ``typing.get_type_hints`` of the class, the origin
and arguments of ``Optional[...]`` / ``List[...]`` / ``Dict[...]``, the dataclass fields. That
work depends only on the type, and it is most of the cost: ~0.3 s of a 0.85 s load of a
1,000-tensor program (24,000 values), more than mapping 2 GiB of weights.

``SchemaDecoder`` gives the same result with that work done once per type: ``plan(cls)`` is a
function of the data alone, built the first time ``cls`` is met and kept. It is a port of one
torch function's behaviour, value for value and error for error (the same exceptions, raised
for the same data), so the torch adapter (``torchrt``) installs it only for the exact source
of torch's function it was written against, and only inside the registry's own loads; a torch
whose function differs keeps its own.

Nothing here imports torch: the schema's namespace (where torch resolves a type named by a
string) and the base class of its tagged unions are given.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Point:
    ...     x: float
    ...     tags: list[str]
    >>> SchemaDecoder({}, type("Union", (), {})).decode(Point, {"x": 1, "tags": ["a"]})
    Point(x=1.0, tags=['a'])
"""
from __future__ import annotations

import dataclasses
import threading
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

__all__ = ["SchemaDecoder", "union_create"]

Plan = Callable[[Any], Any]
_NONE = type(None)


def _raising(exc: Exception) -> Plan:
    """A plan that could not be built: it raises what building it raised, when it is used (as
    torch raises only when a value of that type is decoded)."""
    def plan(data: Any) -> Any:
        raise exc
    return plan


def union_create(cls: Any) -> Callable[[str, Any], Any]:
    """``(tag, value) -> cls.create(**{tag: value})``: how torch builds a tagged union."""
    def create(tag: str, value: Any) -> Any:
        return cls.create(**{tag: value})
    return create


class SchemaDecoder:
    """``decode(cls, data)``: what torch's ``_dict_to_dataclass(cls, data)`` returns.

    The rules, in torch's order: a type named by a string (or a forward reference) is looked
    up in ``namespace`` (a name not there is an ``AssertionError``); ``Annotated[T, ...]`` is
    ``T``; ``Optional[T]`` is None for None, else ``T``; a tagged union (a subclass of
    ``union_base``) is a dict of exactly one key, decoded as that field and built with
    ``cls.create`` (or what ``union_constructor`` gives for the class); a dataclass takes each of its fields present in the dict, decoded as the
    field's type (other keys are ignored, for forward compatibility); otherwise a list is
    decoded item by item as the type's first argument (an empty list is returned as it is), a
    dict value by value as its second, a ``float`` is made a float, and anything else is
    returned unchanged. Plans are built under a lock, once each; decoding takes none."""

    def __init__(self, namespace: dict[str, Any], union_base: type,
                 union_constructor: Callable[[type], Callable[[str, Any], Any]] = union_create) -> None:
        """``namespace``: the schema module's globals (names are looked up, and type hints
        resolved, there). ``union_constructor(cls)``: a function ``(tag, value)`` that builds
        what ``cls.create(**{tag: value})`` would (the torch adapter's builds it directly)."""
        self._union_constructor = union_constructor
        self._namespace = namespace
        self._union = union_base
        self._plans: dict[Any, Plan] = {}
        self._building: dict[Any, Plan] = {}   # plans being built (recursive types), under _lock
        self._lock = threading.RLock()

    def decode(self, cls: Any, data: Any) -> Any:
        return self.plan(cls)(data)

    def plan(self, cls: Any) -> Plan:
        try:
            found = self._plans.get(cls)
        except TypeError:   # an unhashable type: planned each time, as torch does
            return self._build(cls)
        if found is not None:
            return found
        with self._lock:
            found = self._plans.get(cls) or self._building.get(cls)
            if found is not None:
                return found
            cell: list[Plan] = []
            self._building[cls] = lambda data: cell[0](data)   # used only once built (below)
            try:
                built = self._build(cls)
            except Exception as exc:
                cell.append(_raising(exc))
                raise
            finally:
                del self._building[cls]
            cell.append(built)
            self._plans[cls] = built
            return built

    def _resolve(self, cls: Any) -> Any:
        if isinstance(cls, str):
            found = self._namespace.get(cls)
            if found is not None:
                return found
        if isinstance(cls, typing.ForwardRef):
            return self._resolve(cls.__forward_arg__)
        return cls

    def _deferred(self, cls_of: Callable[[], Any]) -> Plan:
        """The plan of the type ``cls_of()`` gives; if that fails, or the plan cannot be built, a
        plan that raises the same when it is used (torch looks a type up only to decode a value)."""
        try:
            return self.plan(cls_of())
        except Exception as exc:
            return _raising(exc)

    def _build(self, cls: Any) -> Plan:
        cls = self._resolve(cls)
        if isinstance(cls, str):
            raise AssertionError(f"Unresolved class type: '{cls}'.")
        origin = typing.get_origin(cls)
        if origin is Annotated:
            return self.plan(cls.__origin__)
        if origin in (typing.Union, types.UnionType) and _NONE in typing.get_args(cls):
            return self._optional(typing.get_args(cls))
        if isinstance(cls, type) and issubclass(cls, self._union):
            return self._tagged(cls)
        if dataclasses.is_dataclass(cls):
            return self._record(cls)
        return self._value(cls)

    def _optional(self, args: tuple[Any, ...]) -> Plan:
        if len(args) != 2:
            def wrong(data: Any) -> Any:
                if data is None:
                    return None
                raise AssertionError(f"expected 2 type args, got {len(args)}")
            return wrong
        inner = self._deferred(lambda: args[0])

        def optional(data: Any) -> Any:
            return None if data is None else inner(data)
        return optional

    def _tagged(self, cls: Any) -> Plan:
        hints: list[dict[str, Any]] = []   # the union's type hints, once a value needs them
        members: dict[str, Plan] = {}
        create_one = self._union_constructor(cls)

        def tagged(data: Any) -> Any:
            if not isinstance(data, dict):
                raise AssertionError(f"expected dict, got {type(data).__name__}")
            if len(data) != 1:
                raise AssertionError(f"expected dict with 1 key, got {len(data)}")
            [(tag, value)] = data.items()
            if not isinstance(tag, str):
                raise AssertionError(f"expected str key, got {type(tag).__name__}")
            member = members.get(tag)
            if member is None:
                if not hints:
                    hints.append(typing.get_type_hints(cls, globalns=self._namespace))
                member = members[tag] = self.plan(hints[0][tag])
            return create_one(tag, member(value))
        return tagged

    def _record(self, cls: Any) -> Plan:
        hints = typing.get_type_hints(cls, globalns=self._namespace)
        fields = [(f.name, self._deferred(lambda: hints[f.name])) for f in dataclasses.fields(cls)]  # noqa: B023 - called at once

        def record(data: Any) -> Any:
            return cls(**{name: plan(data[name]) for name, plan in fields if name in data})
        return record

    def _value(self, cls: Any) -> Plan:
        items: list[Plan] = []    # the plan of the first type argument, once a list needs it
        values: list[Plan] = []   # of the second, once a dict needs it
        is_float = cls is float

        def value(data: Any) -> Any:
            if isinstance(data, list):
                if len(data) == 0:
                    return data
                if not items:
                    items.append(self.plan(typing.get_args(cls)[0]))
                item = items[0]
                return [item(d) for d in data]
            if isinstance(data, dict):
                if not values:
                    values.append(self.plan(typing.get_args(cls)[1]))
                each = values[0]
                return {k: each(v) for k, v in data.items()}
            if is_float:
                return float(data)
            return data
        return value
