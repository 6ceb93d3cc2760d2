"""A custom op library for the loader tests: ``pt2reg_mylib::scale_add``, with a CPU kernel only.

Import it to register the op (``pt2reg verify BUNDLE --import tests.ops_mylib``). The test
process itself never imports it: bundles needing the op are built in a subprocess, so "the op
is not registered here" is real, not simulated.
"""
from __future__ import annotations

import torch

__all__ = ["scale_add", "SCHEMA"]

SCHEMA = "pt2reg_mylib::scale_add(Tensor x, float alpha) -> Tensor"


@torch.library.custom_op("pt2reg_mylib::scale_add", mutates_args=(), device_types="cpu")
def scale_add(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + 1.0


@scale_add.register_fake
def _(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)
