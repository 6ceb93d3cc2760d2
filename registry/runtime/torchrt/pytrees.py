"""pytrees: flatten, unflatten, treespecs, call binding from a program's ``in_spec``, and
stand-ins for library output classes (transformers ``ModelOutput``) not importable here."""
from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ...errors import InputValidationError
from .version import torch

if TYPE_CHECKING:
    pass


__all__ = ['flatten_outputs', 'bind_call', 'tree_flatten', 'tree_unflatten', 'treespec_loads', 'PytreeStandIn', 'pytree_registered', 'stand_in_pytree_classes', 'pytree_missing', 'module_to_import']


def flatten_outputs(out: Any) -> list[Any]:
    """The tensors (and other leaves) of a nested output, in pytree order."""
    return tree_flatten(out)[0]


# -- pytrees ------------------------------------------------------------------------------------

def tree_flatten(value: Any) -> tuple[list[Any], Any]:
    """(leaves, treespec) of a nested value, as torch.export flattens inputs and outputs."""
    from torch.utils._pytree import tree_flatten as flatten  # private

    return flatten(value)


def tree_unflatten(leaves: Iterable[Any], spec: Any) -> Any:
    """The nested value ``spec`` describes, with ``leaves`` in place."""
    from torch.utils._pytree import tree_unflatten as unflatten  # private

    return unflatten(list(leaves), spec)


def treespec_loads(text: str) -> Any:
    """A treespec from its serialized JSON form (``in_spec``/``out_spec`` of a manifest)."""
    from torch.utils._pytree import treespec_loads as loads  # private

    return loads(text)


def bind_call(args: tuple, kwargs: dict, in_spec: str | None,
              arg_names: list[str] | None = None) -> tuple[list[Any], tuple, dict]:
    """Match a call to the program's input treespec: (flat leaves, args, kwargs) in its order.

    Positional parameters passed by keyword (``model(x=t)``) are moved into place by name, and
    keyword arguments are reordered as exported. A structure that cannot match raises
    InputValidationError naming what the program takes.
    """
    if not in_spec:
        return [*args, *kwargs.values()], tuple(args), dict(kwargs)
    spec = treespec_loads(in_spec)
    n_pos = spec.child(0).num_children
    want_kw = list(spec.child(1).context or [])
    args, kwargs = list(args), dict(kwargs)
    for pname in (arg_names or [])[len(args):n_pos]:
        if pname not in kwargs:
            break
        args.append(kwargs.pop(pname))
    positional = (arg_names or [])[:n_pos] if len(arg_names or []) >= n_pos else [f"{n_pos} positional"]
    expected = ", ".join([*positional, *want_kw])
    if len(args) != n_pos or set(kwargs) != set(want_kw):
        got = [f"{len(args)} positional", *sorted(kwargs)]
        raise InputValidationError(f"the program takes ({expected}), got ({', '.join(got)})")
    kwargs = {k: kwargs[k] for k in want_kw}
    flat, got_spec = tree_flatten((tuple(args), kwargs))
    if got_spec != spec:
        raise InputValidationError(f"the inputs' nesting does not match the program's: expected {spec}")
    return flat, tuple(args), kwargs


# -- library pytree classes (transformers ModelOutput, registered dataclasses) ------------------

#: stand-ins this process registered, by serialized type name
_STAND_INS: dict[str, Any] = {}


class PytreeStandIn(dict):
    """What a program returns in place of a library output class that is not imported here
    (e.g. ``transformers.modeling_outputs.CausalLMOutputWithCrossAttentions``): a dict with the
    same fields, readable as ``out["logits"]``, ``out.logits`` and, like ``ModelOutput``,
    ``out[0]``. It pickles as a plain dict. ``type(out).serialized_type_name`` names the class."""

    serialized_type_name: str = ""
    fields: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        if name in type(self).fields or name in self:
            return self.get(name)
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            return list(self.values())[key]
        return dict.__getitem__(self, key)

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self.values())

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


def pytree_registered(serialized_name: str) -> bool:
    """Whether torch can deserialize this pytree type name in this process now (the real class,
    imported by the user, or a stand-in registered earlier). Never imports anything."""
    mod = sys.modules.get("torch.utils._pytree")  # private: pytree registry
    if mod is None:
        return False
    return serialized_name in getattr(mod, "SERIALIZED_TYPE_TO_PYTHON_TYPE", {})


def stand_in_pytree_classes(classes: list[dict[str, Any]]) -> list[str]:
    """Before torch deserializes a program: register a :class:`PytreeStandIn` under each
    serialized type name torch cannot resolve here, so the program loads without the library.

    ``classes`` come from the manifest (``ProgramSpec.pytree_classes``: type, fields, style).
    A class already registered (the user imported its module, e.g. ``--import
    transformers.modeling_outputs``) is left alone: the real class is used. Nothing is ever
    imported because a manifest names it. Returns the names stood in for; a class whose context
    is not a list of field names (``fields`` None) is skipped (the compat rule refuses it)."""
    torch()
    from torch.utils import _pytree as pytree  # private: serialized-name registration

    done = []
    for c in classes:
        name, fields, style = c.get("type"), c.get("fields"), c.get("style")
        if not name or fields is None or pytree_registered(name):
            continue
        short = name.rsplit(".", 1)[-1]
        cls = type(short if short.isidentifier() else "PytreeStandIn", (PytreeStandIn,),
                   {"serialized_type_name": name, "fields": tuple(fields), "__module__": __package__,
                    "__qualname__": f"PytreeStandIn[{name}]"})

        if style == "dataclass":
            def flatten(obj: Any) -> tuple[list[Any], Any]:
                keys = [k for k in type(obj).fields if obj.get(k) is not None]
                nones = [k for k in type(obj).fields if obj.get(k) is None]
                return [obj[k] for k in keys], [keys, nones]

            def unflatten(values: Any, context: Any, cls: Any = cls) -> Any:
                keys, nones = context
                out = cls(zip(keys, values))
                out.update(dict.fromkeys(nones))
                return out
        else:
            def flatten(obj: Any) -> tuple[list[Any], Any]:
                keys = [k for k in obj if obj[k] is not None]
                return [obj[k] for k in keys], keys

            def unflatten(values: Any, context: Any, cls: Any = cls) -> Any:
                return cls(zip(context, values))

        def flatten_with_keys(obj: Any, flatten: Any = flatten, style: Any = style) -> tuple[list[Any], Any]:
            values, context = flatten(obj)
            keys = context[0] if style == "dataclass" else context
            return [(pytree.MappingKey(k), v) for k, v in zip(keys, values)], context

        pytree.register_pytree_node(cls, flatten, unflatten, serialized_type_name=name,
                                    flatten_with_keys_fn=flatten_with_keys)
        _STAND_INS[name] = cls
        done.append(name)
    return done


_NOT_REGISTERED = re.compile(r"Deserializing (\S+) in pytree is not registered|"
                             r"deserialize TreeSpec of namedtuple class (\S+) because")


def pytree_missing(exc: BaseException) -> str | None:
    """The serialized type name in torch's "Deserializing X in pytree is not registered"."""
    for e in (exc, exc.__cause__, exc.__context__):
        m = _NOT_REGISTERED.search(str(e)) if e is not None else None
        if m:
            return (m.group(1) or m.group(2)).rstrip(".")
    return None


def module_to_import(serialized_name: str) -> str:
    """The module a serialized pytree type name comes from (``a.b.C`` -> ``a.b``)."""
    return serialized_name.rsplit(".", 1)[0] if "." in serialized_name else serialized_name
