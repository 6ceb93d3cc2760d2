"""One device value for every layer: ``Device.parse("cuda:1")`` -> ``Device("cuda", 1)``.

Every device a user names (``--device``, ``registry.load(device=...)``, ``attest``, ``compile``,
an attestation sent to the server) is parsed here, once, and travels as a ``Device``; it is
turned back into torch's string form (``str(device)``) only where torch is called. The
grammar is torch's: a device type (``cpu``, ``cuda``, ``mps``, ``xpu``, ``meta``, or one a
backend registers, such as ``privateuseone``), optionally ``:`` and an index. Pure: no torch.

    >>> Device.parse("cuda:1"), Device.parse("cuda").index, str(Device.parse(" CPU "))
    (Device(type='cuda', index=1), None, 'cpu')
    >>> Device.parse("cuda").same_as(Device.parse("cuda:0"))
    True

The *default* device (none named) is decided in one place, ``registry.runtime.probe.resolve_device``:
``cuda:0`` when this machine has a usable CUDA (or ROCm) GPU, else ``cpu``, for ``pt2reg run``,
``verify``, ``attest``, ``target`` and ``registry.load`` alike.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError

__all__ = ["Device", "DeviceLike", "CPU", "MAX_DEVICE_INDEX"]

_DEVICE = re.compile(r"^([a-z_][a-z0-9_]{0,31})(?::(\d{1,5}))?$")
#: the largest index accepted (torch's DeviceIndex is an int8 today; this leaves room)
MAX_DEVICE_INDEX = 4096


@dataclass(frozen=True, eq=False)
class Device:
    """A torch device: ``type`` (``cuda``) and ``index`` (None: the type's current device).
    It equals its own text (``Device("cuda", 0) == "cuda:0"``), so code written when devices
    were strings keeps working; ``same_as`` is the comparison that lets ``cuda`` match ``cuda:1``."""

    type: str
    index: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not _DEVICE.match(self.type):
            raise UsageError(f"invalid device type {self.type!r}",
                             hint="use a torch device like cpu, cuda or cuda:1")
        if self.index is not None and (not isinstance(self.index, int) or isinstance(self.index, bool)
                                       or not 0 <= self.index <= MAX_DEVICE_INDEX):
            raise UsageError(f"invalid device index {self.index!r} for {self.type}",
                             hint=f"an index is an integer from 0 to {MAX_DEVICE_INDEX}")

    @classmethod
    def parse(cls, value: DeviceLike) -> Device:
        """A ``Device`` from its text (``cpu``, ``cuda``, ``cuda:1``; case and surrounding
        blanks ignored) or a ``Device``; one ``UsageError`` line (exit 2) for anything else."""
        if isinstance(value, Device):
            return value
        text = value.strip().lower() if isinstance(value, str) else None
        m = _DEVICE.match(text or "")
        if not m:
            shown = value if isinstance(value, str) else type(value).__name__
            raise UsageError(f"invalid device {shown!r}", hint="use a torch device like cpu, cuda or cuda:1")
        return cls(m.group(1), int(m.group(2)) if m.group(2) is not None else None)

    @classmethod
    def parse_optional(cls, value: DeviceLike | None) -> Device | None:
        """``parse``, with None (no device named: the default applies) kept as None."""
        return None if value is None else cls.parse(value)

    @classmethod
    def try_parse(cls, value: object) -> Device | None:
        """``parse`` for a device read from a file (a manifest's baked device): None, not an
        error, when it is not one."""
        try:
            return cls.parse(value) if isinstance(value, (str, Device)) else None
        except UsageError:
            return None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            other = Device.try_parse(other)
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash(str(self))

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"

    def same_as(self, other: DeviceLike) -> bool:
        """The same device: same type, and the same index where both name one (``cuda`` is
        the current CUDA device, so it matches ``cuda:1``; ``cuda:0`` does not)."""
        o = Device.parse(other)
        return self.type == o.type and (self.index is None or o.index is None or self.index == o.index)

    def with_index(self, index: int | None) -> Device:
        return Device(self.type, index)


#: what a caller may pass where a device is taken: its text or a ``Device``
DeviceLike = str | Device
CPU = Device("cpu")
