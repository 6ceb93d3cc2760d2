"""A write that fails half-way (disk full, quota, a file size limit) is one line naming the path
and what to do, exit 1, and leaves neither the output nor a temp file behind; nothing is printed
after it (no zipfile finalizer noise)."""
import resource
import signal

from registry.format.bundle import BundleFile
from tests.fixtures_pt2 import cli_process, run_cli


def _file_size_limit(limit: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def test_bundle_whose_output_cannot_be_written_is_one_line_and_leaves_nothing(pt2_dir, tmp_path):
    args = ("bundle", f"encoder={pt2_dir / 'encoder.pt2'}", f"decoder={pt2_dir / 'decoder.pt2'}")
    full = tmp_path / "ok.pt2b"
    assert run_cli(*args, "-o", str(full)).returncode == 0
    size = full.stat().st_size
    biggest = max(m.size for m in BundleFile.open(full).manifest.members)
    limit = biggest + (size - biggest) // 2  # the scratch programs fit; the bundle does not
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = cli_process(*args, "-o", str(out_dir / "ed.pt2b"), preexec_fn=_file_size_limit(limit))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: File too large: ") and str(out_dir / "ed.pt2b") in r.stderr, r.stderr
    assert "ulimit" in r.stderr
    assert list(out_dir.iterdir()) == []
