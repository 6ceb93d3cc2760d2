"""A ``.pt2``'s weights mapped from the file, not copied (``_mapped_file_map`` replaces torch's
reader inside the registry's loads); a read of an unverified record raises ``WeightsNotVerified``."""
from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .version import torch

if TYPE_CHECKING:
    from ...blobs.inplace import InPlaceSegment


__all__ = ['WeightsNotVerified']


class WeightsNotVerified(Exception):
    """torch was about to read a record of the archive whose bytes are not verified yet (a
    cold load overlapping the fetch of the weights, see ``load_exported_program``): wait for
    the fetch, then load again. Never reaches a user."""


_MAPPING = threading.local()  # this thread's mapped file while load_pt2 runs, else unset


@contextlib.contextmanager
def _weights_mapped(f: Any, unverified: frozenset[str] = frozenset(),
                    elsewhere: Iterable[InPlaceSegment] = ()) -> Iterator[None]:
    """While ``load_pt2`` reads ``f`` in this thread: every weight and constant is placed on the
    CPU, whatever device the file names (``_on_host``: a program exported on a GPU deserializes
    on a machine without one, and nothing here initializes a GPU; the loader then moves the
    program to the device that runs it); with ``f``, the weights are built over a map of ``f``
    (the records ``elsewhere`` places over maps of their own files); reading a record in
    ``unverified`` raises ``WeightsNotVerified`` instead."""
    installed = _install_mapped_file_map()
    if unverified:
        _install_read_guard()
        _MAPPING.unverified = unverified
    _MAPPING.elsewhere = {s.offset: s for s in elsewhere}
    _MAPPING.host = installed
    try:
        if f is None or not installed:
            if unverified or _MAPPING.elsewhere:  # torch copies every weight: each must be verified first
                raise WeightsNotVerified("weights are copied, not mapped")
            yield
            return
        with _file_mapped(f, unverified):
            yield
    finally:
        _MAPPING.unverified = frozenset()
        _MAPPING.elsewhere = {}
        _MAPPING.host = False


def _on_host(config: Any) -> None:
    """Every tensor record of a payload config (weights, constants) placed on the CPU: the
    device in its ``tensor_meta`` is rewritten before torch's loader (or ours) reads it. Only the
    graph's metadata keeps the exporting device, which ``move_to_device`` rewrites."""
    from torch._export.serde.schema import Device  # private: the serializer's device record

    for meta in config.config.values():
        tensor_meta = meta.tensor_meta
        if tensor_meta is not None and getattr(tensor_meta.device, "type", "cpu") != "cpu":
            tensor_meta.device = Device(type="cpu", index=None)


@contextlib.contextmanager
def _file_mapped(f: Any, unverified: frozenset[str]) -> Iterator[None]:
    size = os.fstat(f.fileno()).st_size
    # the open file itself (its inode), not its path: a file renamed over it meanwhile is not mapped
    same = f"/proc/self/fd/{f.fileno()}" if os.path.isdir("/proc/self/fd") else os.fspath(f.name)
    _MAPPING.path = same  # where record sizes are read when torch's reader cannot say them
    try:
        _MAPPING.storage = torch().UntypedStorage.from_file(same, shared=False, nbytes=size) if size else None
    except (RuntimeError, OSError) as exc:  # a file system that cannot map: torch's copy
        logging.getLogger(__name__).debug("weights not mapped (%s): copying them", exc)
        _MAPPING.storage = None
        if unverified:  # the copy would read bytes not verified yet
            raise WeightsNotVerified(f"cannot map {f.name}: {exc}") from None
    try:
        yield
    finally:
        _MAPPING.storage = _MAPPING.path = None


def _install_mapped_file_map() -> bool:
    """Route torch's ``_build_file_map`` (raw payload record -> flat tensor) through
    ``_mapped_file_map`` (records on the CPU, mapped where the thread maps a file) once per
    process; False if this torch has no such function (then weights are copied, as torch
    does, onto the devices the file names)."""
    import torch.export.pt2_archive._package as package  # private: the payload loader

    original = getattr(package, "_build_file_map", None)
    if original is None:
        return False
    if not getattr(original, "registry_mapped", False):
        def build_file_map(archive_reader: Any, config: Any, base_dir: str) -> dict[str, Any]:
            if getattr(_MAPPING, "host", False):  # one of the registry's loads (this thread)
                _on_host(config)
            storage = getattr(_MAPPING, "storage", None)
            unverified = getattr(_MAPPING, "unverified", frozenset())
            elsewhere = getattr(_MAPPING, "elsewhere", {})
            mapped = None if storage is None else _mapped_file_map(archive_reader, config, base_dir, storage,
                                                                   unverified, elsewhere)
            if mapped is None and unverified:  # torch's loader copies every record it lists
                for meta in config.config.values():
                    _check_verified(os.path.join(base_dir, meta.path_name), unverified)
            return original(archive_reader, config, base_dir) if mapped is None else mapped

        build_file_map.registry_mapped = True  # type: ignore[attr-defined]
        package._build_file_map = build_file_map
    return True


def _check_verified(record: str, unverified: frozenset[str]) -> None:
    """``WeightsNotVerified`` if reading archive record ``record`` would read unverified bytes."""
    if unverified and posixpath.normpath(record) in unverified:
        raise WeightsNotVerified(f"record {record} is not verified yet")


def _install_read_guard() -> None:
    """Make torch's archive reader refuse, once per process, to read a record this thread's
    load marked unverified (``_MAPPING.unverified``): every record torch reads outside
    ``_build_file_map`` goes through ``PT2ArchiveReader.read_bytes``."""
    import torch.export.pt2_archive._package as package  # private: the archive reader

    reader = package.PT2ArchiveReader
    original = reader.read_bytes
    if getattr(original, "registry_guarded", False):
        return

    def read_bytes(self: Any, name: str) -> bytes:
        _check_verified(name, getattr(_MAPPING, "unverified", frozenset()))
        return original(self, name)

    read_bytes.registry_guarded = True  # type: ignore[attr-defined]
    reader.read_bytes = read_bytes


def _mapped_file_map(archive_reader: Any, config: Any, base_dir: str, storage: Any,
                     unverified: frozenset[str] = frozenset(),
                     elsewhere: Mapping[int, InPlaceSegment] | None = None) -> dict[str, Any] | None:
    """torch's ``_build_file_map`` with each raw record a view of ``storage`` (a map of the
    whole archive) at the record's data offset instead of a copy; None (torch's own loader then
    copies them all, or reports what is wrong) if a record is not aligned to its dtype, does not
    lie inside the file, or has no tensor metadata, or if neither this torch's archive reader nor
    the archive's central directory says where each record lies (torch 2.11's reader has no
    ``get_record_size``: ``_directory_spans``). A record ``elsewhere`` holds (by its offset and
    size) is a view of a map of that segment's file instead (``_segment_storage``)."""
    t = torch()
    from torch._export.serde.serialize import (  # private: the serializer's decoders
        deserialize_device,
        deserialize_scalar_type,
        deserialize_size,
    )

    reader, planned = archive_reader.archive_file, []
    offset_of = getattr(reader, "get_record_offset", None)
    size_of = getattr(reader, "get_record_size", None)
    spans = None  # torch 2.11's reader has no sizes: (offset, size) from the central directory
    if offset_of is None or (size_of is None and (spans := _directory_spans(storage.nbytes())) is None):
        return None
    for meta in config.config.values():
        if meta.use_pickle:  # torch.load's, after this map is built (read through read_bytes)
            continue
        if meta.tensor_meta is None:  # malformed: torch's own loader says so
            return None
        dtype = deserialize_scalar_type(meta.tensor_meta.dtype)
        record = os.path.join(base_dir, meta.path_name)
        try:
            offset = offset_of(record)
            nbytes = size_of(record) if spans is None else spans[record][1]
        except (KeyError, RuntimeError):  # a record the archive does not hold: torch says so
            return None
        if spans is not None and spans[record][0] != offset:  # no view is ever misplaced
            return None
        width = t._utils._element_size(dtype)
        if nbytes and (nbytes % width or offset % width or offset < 0 or offset + nbytes > storage.nbytes()):
            return None
        planned.append((meta, dtype, width, offset, nbytes))
    file_map: dict[str, Any] = {}
    files: dict[str, Any] = {}  # path -> map of a store file holding records in place
    starts = sorted(elsewhere) if elsewhere else []
    for meta, dtype, width, offset, nbytes in planned:
        if meta.path_name in file_map:
            continue
        tensor_meta = meta.tensor_meta
        if nbytes == 0:
            tensor = t.zeros(deserialize_size(tensor_meta.sizes), dtype=dtype)
        else:
            base, at = storage, offset
            if elsewhere:  # the file at ``storage`` lacks these bytes: never view it there
                segments = _segments_of(elsewhere, starts, offset, nbytes, record=meta.path_name)
                if len(segments) == 1:  # at the same offset modulo 16 (inplace.ALIGN)
                    base, at = _segment_storage(segments[0], files), segments[0].file_offset
                elif segments:  # the pieces of a split tensor, side by side
                    base, at = _pieces_storage(segments), 0
            tensor = t.empty(0, dtype=dtype)
            tensor.set_(base[at:at + nbytes], 0, (nbytes // width,), (1,))
        if tensor_meta.requires_grad:
            tensor.requires_grad_(True)
        device = deserialize_device(tensor_meta.device)
        if device != t.device("cpu"):
            _check_verified(os.path.join(base_dir, meta.path_name), unverified)  # .to() reads it
            tensor = tensor.to(device)
        file_map[meta.path_name] = tensor
    return file_map


def _segments_of(elsewhere: Mapping[int, InPlaceSegment], starts: list[int], offset: int, nbytes: int,
                 record: str) -> list[InPlaceSegment]:
    """The segments that tile the record at ``offset`` (``nbytes``) exactly, in order; none if
    no segment overlaps it; ``WeightsNotVerified`` (load a complete copy) if some overlap it
    without tiling it."""
    k = bisect_left(starts, offset + nbytes) - 1
    found: list[InPlaceSegment] = []
    while k >= 0 and starts[k] + elsewhere[starts[k]].size > offset:
        found.append(elsewhere[starts[k]])
        k -= 1
    found.reverse()
    if found and (found[0].offset != offset or sum(s.size for s in found) != nbytes or
                  any(a.offset + a.size != b.offset for a, b in zip(found, found[1:]))):
        raise WeightsNotVerified(f"record {record} is not tiled by the segments held in place")
    return found


def _pieces_storage(segments: list[InPlaceSegment]) -> Any:
    """One storage over the pieces of a split tensor, each mapped from its own store file."""
    from ...blobs.inplace import map_together

    try:
        region = map_together(segments)
    except OSError as exc:  # NotInPlace among them: a piece is no longer the file first seen
        raise WeightsNotVerified(f"cannot map the pieces of a record: {exc}") from None
    return torch().frombuffer(region, dtype=torch().uint8).untyped_storage()


def _segment_storage(segment: InPlaceSegment, files: dict[str, Any]) -> Any:
    """A private map of the store file ``segment`` lies in (one per file and load), opened by
    descriptor after checking it is still the file its bytes were (or will be) hashed in."""
    from ...blobs.inplace import NotInPlace, open_in_place

    if segment.path not in files:
        try:
            fd = open_in_place(segment.path, segment.identity)
        except NotInPlace as exc:
            raise WeightsNotVerified(str(exc)) from None
        try:
            files[segment.path] = torch().UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=False,
                                                                   nbytes=segment.identity.size)
        except (RuntimeError, OSError) as exc:
            raise WeightsNotVerified(f"cannot map {segment.path}: {exc}") from None
        finally:
            os.close(fd)
    return files[segment.path]


def _directory_spans(size: int) -> dict[str, tuple[int, int]] | None:
    """``record -> (data offset, size)`` of the archive being mapped (``_MAPPING.path``), from
    its central directory (``zipsafe.canonical_data_spans``), for a torch whose archive reader
    has no ``get_record_size``; None unless the archive is canonical (stored, exact local
    headers). The caller also requires every offset to agree with torch's own."""
    from ...errors import UnsafeArchiveError
    from ...format.zipsafe import canonical_data_spans

    path = getattr(_MAPPING, "path", None)
    if path is None:
        return None
    try:
        with open(path, "rb") as fp:  # a file description of its own: torch's reads are not moved
            spans = canonical_data_spans(fp, size, where=path)
    except (OSError, UnsafeArchiveError):
        return None
    # member names carry the archive's top folder ("model/data/weights/w0"); torch's do not
    return {name.split("/", 1)[1]: (offset, n) for name, offset, n in spans if "/" in name}
