"""The torch adapter: the one package that touches torch's private APIs, behind small functions.

Everything private (``torch._C``, ``torch._export``, ``torch._inductor``, ``torch.utils._pytree``,
``torch.export.pt2_archive._package``, private attributes of an ``ExportedProgram``) is reached
from this package only, and ``tests/unit/test_torch_adapter.py`` keeps it so. torch is imported
lazily, so importing it is free; a torch upgrade that moves a private API breaks this package
only. Callers: the bundler (live ExportedPrograms, sample outputs), the target probe, the
loader, its sandbox and the sample checks.

One module per mechanism, every public name re-exported here (``registry.runtime.torchrt.X``):

* ``version``: the lazy ``torch()`` import, its version floor, the environment, ``--import`` and
  ``--load-library``;
* ``loading``: save and load ``.pt2`` programs, export guards; ``mapping``: their weights mapped
  from the file, not copied; ``aoti``: AOTInductor packages, loaded and compiled;
* ``devices``: move between devices, CPU ISA, CUDA/HIP;
* ``ops``: the dispatcher: which ops exist, their schemas, which dispatch keys have kernels, TorchBind
  classes, every registered schema (for ``registry.pt2.op_effects``);
* ``decoding``: the serializer's JSON decoding (``schema_decoding``, inside the registry's loads);
* ``pytrees``: flatten, unflatten, treespecs, stand-ins for library output classes.

    >>> has_kernel("aten::add.Tensor", "CPU")                  # doctest: +SKIP
    True
"""
from __future__ import annotations

from .aoti import AOTI_OPTIONS, aoti_compile, load_aoti
from .decoding import DECODER_PORTS, UNION_PORTS
from .devices import (
                      cpu_isa,
                      cuda_available,
                      cuda_capability,
                      cxx11_abi,
                      device_available,
                      device_unavailable,
                      hip_version,
                      move_to_device,
                      to_device,
)
from .loading import (
                      dim_names_of,
                      load_exported_program,
                      load_inputs_file,
                      restore_guards,
                      save_exported_program,
                      torch_loading,
)
from .mapping import WeightsNotVerified
from .ops import (
                      DISPATCH_KEYS,
                      all_op_schemas,
                      has_kernel,
                      op_schema,
                      op_schema_digests,
                      op_schemas,
                      registered_custom_ops,
                      serde_schema_version,
                      torchbind_classes,
)
from .pytrees import (
                      PytreeStandIn,
                      bind_call,
                      flatten_outputs,
                      module_to_import,
                      pytree_missing,
                      pytree_registered,
                      stand_in_pytree_classes,
                      tree_flatten,
                      tree_unflatten,
                      treespec_loads,
)
from .version import check_torch_version, environment, import_modules, load_libraries, quiet_torch, torch

__all__ = ["torch", "check_torch_version", "save_exported_program", "dim_names_of", "op_schema", "op_schemas",
           "load_exported_program", "load_inputs_file", "flatten_outputs", "environment", "import_modules",
           "load_libraries", "quiet_torch", "torch_loading", "restore_guards", "DISPATCH_KEYS", "serde_schema_version",
           "has_kernel", "registered_custom_ops", "all_op_schemas", "op_schema_digests", "torchbind_classes",
           "cpu_isa", "cxx11_abi", "cuda_capability", "cuda_available", "device_available", "hip_version",
           "move_to_device", "device_unavailable", "load_aoti", "bind_call", "to_device", "tree_flatten",
           "tree_unflatten", "treespec_loads", "PytreeStandIn", "pytree_registered", "stand_in_pytree_classes",
           "pytree_missing", "module_to_import", "AOTI_OPTIONS", "aoti_compile", "WeightsNotVerified", "DECODER_PORTS",
           "UNION_PORTS"]
