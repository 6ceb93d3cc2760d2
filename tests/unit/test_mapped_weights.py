"""Weights of a loaded program backed by a private map of its verified cache file
(``torchrt.load_exported_program(map_weights=True)``, what ``registry.load`` uses): the same
values as torch's copying load, for every kind of raw payload; really mapped (no copy at load);
copy-on-write (writing a parameter never writes the file); and only where asked."""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
import torch

from registry.runtime import torchrt
from registry.runtime.torchrt import mapping


class Mixed(torch.nn.Module):
    """Raw payloads of several widths, a tied weight, an empty parameter, a lifted constant."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.tied = self.proj.weight  # one payload, two names
        self.bf16 = torch.nn.Parameter(torch.randn(7, 3).to(torch.bfloat16))
        self.empty = torch.nn.Parameter(torch.zeros(0, 4))
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64))
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.table = torch.randn(3, 16, dtype=torch.float64)  # a plain attribute: a lifted constant
        base = torch.randn(4, 6)
        self.register_buffer("base", base)
        self.register_buffer("tail", base[1:, 2:])  # a strided view at an offset into the same payload
        self.register_buffer("f8", torch.randn(8).to(torch.float8_e4m3fn))
        self.register_buffer("cplx", torch.randn(3, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x) + (self.tied @ x.T).T + self.bf16.float().sum() + self.steps.sum()
        extra = self.tail.sum() + self.base.sum() + self.f8.float().sum() + self.cplx.abs().sum()
        return y * self.mask.float().sum() + self.table.float().sum() + self.empty.sum() + extra


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("mapped") / "mixed.pt2"
    torch.export.save(torch.export.export(Mixed().eval(), (torch.randn(2, 16),)), path)
    return path


@pytest.fixture(scope="module")
def canonical(program: Path) -> Path:
    """The program as a bundle holds it (``normalize_pt2``: stored, exact local headers), what
    the loader maps."""
    from registry.pt2.normalize import normalize_pt2
    from registry.pt2.reader import open_pt2

    dest = program.with_name("canonical.pt2")
    normalize_pt2(open_pt2(program), dest)
    return dest


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mapped(path: Path) -> bool:
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


def test_mapped_load_equals_torchs_copy(program: Path) -> None:
    copied = torchrt.load_exported_program(program)
    mapped = torchrt.load_exported_program(program, map_weights=True)
    assert copied.state_dict.keys() == mapped.state_dict.keys()
    for name, value in copied.state_dict.items():
        assert mapped.state_dict[name].dtype == value.dtype, name
        assert torch.equal(mapped.state_dict[name], value), name
    assert copied.constants.keys() == mapped.constants.keys() and copied.constants
    for name, value in copied.constants.items():
        assert torch.equal(mapped.constants[name], value), name
    x = torch.randn(2, 16)
    assert torch.equal(mapped.module()(x), copied.module()(x))
    assert isinstance(mapped.state_dict["proj.weight"], torch.nn.Parameter)
    tail, base = mapped.state_dict["tail"], mapped.state_dict["base"]
    assert tail.stride() == base.stride() and tail.storage_offset() == 8  # torch's own view, kept


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_weights_are_a_private_map_of_the_file_not_copies(canonical: Path, tmp_path: Path) -> None:
    program = canonical  # as bundles hold it: mapped on every torch (2.10/2.11 readers lack record sizes)
    own = tmp_path / "own.pt2"  # a file of its own: no other test's mapping of it
    own.write_bytes(program.read_bytes())
    before = _sha(own)
    copied = torchrt.load_exported_program(own)
    assert not _mapped(own)
    del copied
    ep = torchrt.load_exported_program(own, map_weights=True)
    assert _mapped(own)
    sd = ep.state_dict
    # tied names share one view of the file; nothing was copied for them
    assert sd["proj.weight"].data_ptr() == sd["tied"].data_ptr()
    with torch.no_grad():
        sd["proj.weight"].add_(1.0)  # copy-on-write: this process's page only
        ep.constants["table"].mul_(3.0)
    assert _sha(own) == before
    assert torch.equal(torchrt.load_exported_program(own).state_dict["proj.weight"] + 1.0, sd["proj.weight"])


def test_a_mapped_load_in_one_thread_leaves_another_threads_load_copying(program: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.pt2"
    other.write_bytes(program.read_bytes())
    loaded: dict[str, object] = {}
    started, release = threading.Event(), threading.Event()
    real = mapping._mapped_file_map

    def slow_mapped(*args: object) -> object:  # hold the first load inside its mapped section
        started.set()
        release.wait(30)
        return real(*args)

    mapping._mapped_file_map = slow_mapped  # type: ignore[assignment]
    try:
        t = threading.Thread(target=lambda: loaded.update(a=torchrt.load_exported_program(program, map_weights=True)))
        t.start()
        assert started.wait(30)
        loaded["b"] = torchrt.load_exported_program(other)  # meanwhile, here: torch's copy
        release.set()
        t.join(30)
    finally:
        mapping._mapped_file_map = real  # type: ignore[assignment]
    assert not _mapped(other)
    a, b = loaded["a"], loaded["b"]
    assert torch.equal(a.state_dict["proj.bias"], b.state_dict["proj.bias"])  # type: ignore[attr-defined]


def test_a_record_that_cannot_be_viewed_in_place_leaves_all_of_them_to_torchs_copy(canonical: Path) -> None:
    """Misaligned for its dtype, or past the end of the file: no partial map, torch copies."""
    import torch.export.pt2_archive._package as package

    program = canonical  # as bundles hold it: mapped on every torch (2.10/2.11 readers lack record sizes)
    storage = torch.UntypedStorage.from_file(str(program), shared=False, nbytes=program.stat().st_size)
    mapping._MAPPING.path = str(program)  # where a reader without record sizes finds them
    with package.PT2ArchiveReader(str(program)) as reader:
        config = package._load_payload_config(reader, "data/weights/model_weights_config.json")
        assert mapping._mapped_file_map(reader, config, "data/weights", storage)  # as found: mapped

        class Shifted:  # the same archive, every record said to start `by` bytes later
            def __init__(self, by: int) -> None:
                self.by = by

            def __getattr__(self, name: str) -> object:
                return getattr(reader.archive_file, name)

            def get_record_offset(self, record: str) -> int:
                return reader.archive_file.get_record_offset(record) + self.by

        for by in (1, program.stat().st_size):
            shifted = type("Reader", (), {"archive_file": Shifted(by)})()
            assert mapping._mapped_file_map(shifted, config, "data/weights", storage) is None
    del mapping._MAPPING.path


class _OlderReader:
    """torch's archive reader as an older torch offers it: without ``missing``."""

    def __init__(self, inner: object, missing: str) -> None:
        self.inner, self.missing = inner, missing

    def __getattr__(self, name: str) -> object:
        if name == self.missing:
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_without_get_record_size_sizes_come_from_the_central_directory(canonical: Path, program: Path) -> None:
    """torch 2.11's archive reader has no ``get_record_size`` (seen on a GPU machine): the sizes
    come from the archive's central directory, only where each record's data offset agrees
    with torch's; without ``get_record_offset``, or for a file that is not canonical, no map
    (torch's own loader reads the records)."""
    import torch.export.pt2_archive._package as package

    storage = torch.UntypedStorage.from_file(str(canonical), shared=False, nbytes=canonical.stat().st_size)
    with package.PT2ArchiveReader(str(canonical)) as reader:
        config = package._load_payload_config(reader, "data/weights/model_weights_config.json")
        older = type("Reader", (), {"archive_file": _OlderReader(reader.archive_file, "get_record_size")})()
        mapping._MAPPING.path = None  # no file to read the directory from
        assert mapping._mapped_file_map(older, config, "data/weights", storage) is None
        mapping._MAPPING.path = str(canonical)  # (torch 2.11's own reader needs it too)
        try:
            expected = mapping._mapped_file_map(reader, config, "data/weights", storage)
            got = mapping._mapped_file_map(older, config, "data/weights", storage)
            assert got is not None and got.keys() == expected.keys()
            for name, tensor in expected.items():
                assert torch.equal(got[name], tensor) and got[name].data_ptr() == tensor.data_ptr(), name
            no_offsets = type("Reader", (), {"archive_file": _OlderReader(reader.archive_file, "get_record_offset")})()
            assert mapping._mapped_file_map(no_offsets, config, "data/weights", storage) is None

            class Shifted(_OlderReader):  # torch places the records elsewhere than the directory
                def get_record_offset(self, record: str) -> int:
                    return self.inner.get_record_offset(record) + 64  # still aligned, inside the file

            shifted = type("Reader", (), {"archive_file": Shifted(reader.archive_file, "get_record_size")})()
            assert mapping._mapped_file_map(shifted, config, "data/weights", storage) is None
        finally:
            mapping._MAPPING.path = None


def test_a_mapped_load_through_a_reader_without_record_sizes(canonical: Path, program: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole load, every archive reader torch opens lacking ``get_record_size`` (as torch
    2.11's; run for real there by ``scripts/gpu_check.py``): mapped, with torch's values."""
    import torch.export.pt2_archive._package as package

    real = package.PT2ArchiveReader.__init__

    def older_reader(self, *args, **kwargs) -> None:
        real(self, *args, **kwargs)
        self.archive_file = _OlderReader(self.archive_file, "get_record_size")

    copied = torchrt.load_exported_program(program)
    monkeypatch.setattr(package.PT2ArchiveReader, "__init__", older_reader)
    mapped = torchrt.load_exported_program(canonical, map_weights=True)
    assert _mapped(canonical)
    assert mapped.state_dict.keys() == copied.state_dict.keys()
    for name, value in copied.state_dict.items():
        assert torch.equal(mapped.state_dict[name], value), name


def _weight_records(path: Path) -> frozenset[str]:
    import zipfile

    with zipfile.ZipFile(path) as z:
        names = [n.split("/", 1)[1] for n in z.namelist()]
    return frozenset(n for n in names if n.startswith(("data/weights/", "data/constants/")) and not n.endswith(".json"))


def test_records_not_verified_yet_are_mapped_never_read(canonical: Path) -> None:
    """A cold load deserializes while the raw weights are still being fetched (``unverified``):
    the mapped load reads none of them and gives torch's values; a load that would read one
    (torch's copy: asked for, or because a record cannot be viewed in place) raises
    ``WeightsNotVerified`` before it reads anything, so the loader waits and loads again."""
    import torch.export.pt2_archive._package as package
    program = canonical  # as bundles hold it: mapped on every torch (2.10/2.11 readers lack record sizes)

    records = _weight_records(program)
    assert len(records) >= 8
    mapped = torchrt.load_exported_program(program, map_weights=True, unverified=records)
    copied = torchrt.load_exported_program(program)
    for name, value in copied.state_dict.items():
        assert torch.equal(mapped.state_dict[name], value), name
    with pytest.raises(torchrt.WeightsNotVerified):
        torchrt.load_exported_program(program, unverified=records)
    real = mapping._mapped_file_map
    mapping._mapped_file_map = lambda *a, **k: None  # type: ignore[assignment]
    try:
        with pytest.raises(torchrt.WeightsNotVerified):
            torchrt.load_exported_program(program, map_weights=True, unverified=records)
        # a program whose unverified records are all mapped is unaffected by the copy's check
        torchrt.load_exported_program(program, map_weights=True)
    finally:
        mapping._mapped_file_map = real  # type: ignore[assignment]
    # every other read of a record goes through read_bytes: refused there too, in this thread only
    one = sorted(records)[0]
    with open(program, "rb") as f, mapping._weights_mapped(f, frozenset({one})):
        with package.PT2ArchiveReader(str(program)) as reader:
            with pytest.raises(torchrt.WeightsNotVerified):
                reader.read_bytes(one)
            got: list[bytes] = []
            t = threading.Thread(target=lambda: got.append(reader.read_bytes(one)))
            t.start()
            t.join(30)
            assert got and len(got[0]) > 0
    with package.PT2ArchiveReader(str(program)) as reader:
        assert reader.read_bytes(one) == got[0]  # the guard is off again once the load is over
