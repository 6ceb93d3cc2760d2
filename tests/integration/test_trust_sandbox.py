"""Issue 14 items 3-5: native code only when trusted, the client trust policy, the first-load sandbox.

CLI tests run in-process (CliRunner, ``--home`` with the embedded SQLite + blob directory), as
test_cli_runtime does; the memory bomb runs the CLI in a child with an address-space limit, so a
sandbox that failed to catch it could not take the test machine down.
"""
from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from registry.client.sources import materialize_file  # noqa: E402
from registry.client.trust import glob_match, load_policy  # noqa: E402
from registry.errors import SignatureError, UnsafeArchiveError, UsageError  # noqa: E402
from registry.format.bundle import BundleFile  # noqa: E402
from registry.format.signing import generate_keypair  # noqa: E402
from registry.runtime import sandbox as sandbox_mod  # noqa: E402
from registry.runtime.loader import load  # noqa: E402
from tests.cli_inprocess import invoker, one_error_line  # noqa: E402
from tests.fixtures_pt2 import cli_process  # noqa: E402
from tests.hostile import bundle_with_raw_member, read_json_member, rewrite_pt2  # noqa: E402


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("PT2REG_HOME", str(h))   # registry.load() resolves the same home
    for var in ("PT2REG_DB", "PT2REG_STORE", "PT2REG_TRUST"):
        monkeypatch.delenv(var, raising=False)
    return h


@pytest.fixture
def pt2reg(home):
    return invoker(home)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("release", "other"):
        key, pub = generate_keypair(d / name)
        out[name], out[f"{name}.pub"] = key, pub
    return out


def policy(home: Path, text: str) -> Path:
    path = home / "trust.toml"
    path.write_text(text)
    return path


def rule(models: str, *keys: Path | str, files: bool = False) -> str:
    ks = ", ".join(json.dumps(str(k)) for k in keys)
    return f'[[rule]]\nmodels = "{models}"\nkeys = [{ks}]\n' + ("files = true\n" if files else "")


def push(pt2reg, bundle: Path, name: str, sign: Path | None = None) -> str:
    r = pt2reg("push", bundle, "--name", name, *(["--sign", sign] if sign else []), "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["digest"]


# ------------------------------------------------------------------------------- trust policy

def test_glob_matching_is_per_path_segment():
    assert glob_match("team/*", "team/a") and not glob_match("team/*", "team/a/b")
    assert glob_match("team/**", "team/a/b") and glob_match("**", "x") and glob_match("*", "solo")
    assert not glob_match("*", "team/a") and not glob_match("team/*", "teams/a")
    assert glob_match("team/enc-?", "team/enc-1") and not glob_match("team/enc-?", "team/enc-12")
    assert not glob_match("team.*", "teamxa")  # a dot is literal


def test_trust_policy_enforced_on_pull_verify_run_and_cached_pins(pt2reg, home, bundles, keys, tmp_path):
    push(pt2reg, bundles["ed"], "team/signed", keys["release"])
    unsigned = push(pt2reg, bundles["v1"], "team/unsigned")
    push(pt2reg, bundles["v2"], "other/free")
    push(pt2reg, bundles["v3"], "team/deep/x")
    push(pt2reg, bundles["v4"], "team/wrong-key", keys["other"])
    # verified once without a policy: its blobs and signatures are now cached on this machine
    assert pt2reg("verify", f"team/unsigned@{unsigned}").exit_code == 0
    policy(home, rule("team/*", keys["release.pub"]))

    out = tmp_path / "ok.pt2b"
    r = pt2reg("pull", "team/signed@1", "-o", out)
    assert r.exit_code == 0, r.output
    assert BundleFile.open(out).signatures
    for cmd in (["pull", "team/unsigned@1", "-o", tmp_path / "bad.pt2b"], ["verify", "team/unsigned@1"],
                ["run", "team/unsigned@1", "--samples"], ["verify", f"team/unsigned@{unsigned}"],
                ["run", "team/unsigned", "--samples"]):
        r = pt2reg(*cmd)
        assert r.exit_code == 5, (cmd, r.output)
        line = one_error_line(r)
        assert "model team/unsigned must be signed by release.pub (sha256:" in line, line
        assert "it is not signed" in line and "trust.toml" in line
    assert not (tmp_path / "bad.pt2b").exists()
    r = pt2reg("verify", "team/wrong-key@1")
    assert r.exit_code == 5 and "model team/wrong-key must be signed by release.pub" in one_error_line(r)
    assert "no signature by any of them" in r.stderr
    # `*` is one path segment: team/deep/x and other/free match no rule
    assert pt2reg("verify", "other/free@1").exit_code == 0
    assert pt2reg("verify", "team/deep/x@1").exit_code == 0
    assert pt2reg("run", "team/signed@1", "--samples").exit_code == 0
    policy(home, rule("team/**", keys["release.pub"]))
    r = pt2reg("verify", "team/deep/x@1")
    assert r.exit_code == 5 and "model team/deep/x must be signed" in one_error_line(r)
    # every matching rule applies: a second rule naming only the other key is not met by release
    policy(home, rule("team/*", keys["release.pub"]) + rule("team/signed", keys["other.pub"]))
    r = pt2reg("verify", "team/signed@1")
    assert r.exit_code == 5 and "must be signed by other.pub" in one_error_line(r)
    # an inline key (the PEM text `pt2reg key generate` writes) works like its file
    pem = keys["release.pub"].read_text()
    policy(home, f"[[rule]]\nmodels = [\"team/*\"]\nkeys = ['''{pem}''']\n")
    assert pt2reg("verify", "team/signed@1").exit_code == 0
    r = pt2reg("verify", "team/unsigned@1")
    assert r.exit_code == 5 and "must be signed by an inline key" in one_error_line(r)


def test_trust_policy_in_the_python_api_and_pt2reg_trust(home, bundles, keys, tmp_path, monkeypatch):
    from registry.client import Registry
    from registry.config import Settings

    reg = Registry(Settings.resolve())
    reg.push(bundles["ed"], "team/signed", sign_key=keys["release"], detect_git=False)
    reg.push(bundles["v1"], "team/unsigned", detect_git=False)
    elsewhere = tmp_path / "policies" / "trust.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(rule("team/*", keys["release.pub"]))
    assert load("team/unsigned@1").source.trusted_signers == ()  # no policy yet
    monkeypatch.setenv("PT2REG_TRUST", str(elsewhere))
    with pytest.raises(SignatureError, match=r"model team/unsigned must be signed by release\.pub"):
        load("team/unsigned@1")
    with pytest.raises(SignatureError, match="model team/unsigned"):
        Registry(Settings.resolve()).materialize("team/unsigned@1")
    model = load("team/signed@1")
    assert len(model.source.trusted_signers) == 1 and model.source.trusted_signers[0].startswith("sha256:")
    assert "encoder" in model
    monkeypatch.setenv("PT2REG_TRUST", str(tmp_path / "missing.toml"))
    with pytest.raises(UsageError, match="missing.toml .from PT2REG_TRUST. does not exist"):
        load("team/signed@1")


def test_rules_apply_to_bundle_files_only_with_files_true(pt2reg, home, bundles, keys, tmp_path):
    push(pt2reg, bundles["ed"], "team/signed", keys["release"])
    signed = tmp_path / "signed.pt2b"
    assert pt2reg("pull", "team/signed@1", "-o", signed).exit_code == 0
    policy(home, rule("**", keys["release.pub"]))
    assert pt2reg("verify", bundles["v1"]).exit_code == 0  # a file has no model name
    policy(home, rule("**", keys["release.pub"], files=True))
    r = pt2reg("verify", bundles["v1"])
    assert r.exit_code == 5 and f"bundle file {bundles['v1']} must be signed by release.pub" in one_error_line(r)
    assert pt2reg("run", bundles["v1"], "--samples").exit_code == 5
    assert pt2reg("verify", signed).exit_code == 0
    with pytest.raises(SignatureError, match="bundle file"):
        load(bundles["v1"], cache_dir=tmp_path / "c")
    assert load(signed, cache_dir=tmp_path / "c").source.trusted_signers


@pytest.mark.parametrize("text, words", [
    ("[[rule]\nmodels = 'x'", "is not valid TOML"),
    ("[[rules]]\nmodels = 'x'\nkeys = ['k.pub']\n", "unknown key 'rules'"),
    ("[[rule]]\nmodels = 'team/*'\n", "names no keys"),
    ("[[rule]]\nkeys = ['k.pub']\n", "names no models"),
    ("[[rule]]\nmodels = 'Team/*'\nkeys = ['k.pub']\n", "is not a model name glob"),
    ("[[rule]]\nmodels = 'team/*'\nkeys = []\n", "keys must be a non-empty"),
    ("[[rule]]\nmodels = '**'\nkeys = ['missing.pub']\n", "missing.pub: No such file"),
    ("[[rule]]\nmodels = '**'\nkeys = ['garbage.pub']\n", "is not a PEM public key"),
    ("[[rule]]\nmodels = '**'\nkeys = ['k.pub']\nfiles = 'yes'\n", "files must be true or false"),
])
def test_a_bad_trust_file_is_one_line_exit_2(pt2reg, home, bundles, text, words):
    (home / "garbage.pub").write_text("not a key")
    policy(home, text)
    r = pt2reg("verify", bundles["v1"])
    assert r.exit_code == 2, r.output
    line = one_error_line(r)
    assert words in line and "trust" in line, line
    with pytest.raises(UsageError, match="trust policy"):
        load_policy(home).verify("m", "sha256:" + "0" * 64, [])


# ------------------------------------------------------------------------------- native code

@pytest.fixture(scope="module")
def only_aoti(aoti, tmp_path_factory) -> Path:
    """The aoti bundle without its portable program (the bundler never writes one: a publisher
    could, by hand)."""
    from registry.format.bundle import write_bundle
    from registry.format.manifest import Manifest

    path = tmp_path_factory.mktemp("only-aoti") / "only.pt2b"
    src = BundleFile.open(aoti.path)
    raw = src.manifest.to_json()
    prog = raw["programs"]["encoder"]
    portable = next(v for v in prog["variants"] if v["kind"] == "exported_program")
    prog["variants"] = [v for v in prog["variants"] if v["kind"] == "aoti"]
    raw["members"] = [m for m in raw["members"] if m["path"] != portable["member"] and m["role"] != "sample"]
    raw["samples"] = []
    manifest = Manifest.from_raw(raw)
    write_bundle(path, manifest, {m.path: (lambda p=m.path: src.open_member(p)) for m in manifest.members})
    return path


@pytest.mark.slow
def test_native_variant_needs_trust_native_or_a_trusted_signature(pt2reg, home, aoti, only_aoti, keys, tmp_path):
    r = pt2reg("verify", aoti.path, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["variants"]["encoder"]["id"] == "portable"
    assert "native code from a publisher not trusted here" in doc["variants"]["encoder"]["reason"]
    (note,) = [f for f in doc["findings"] if f["code"] == "native-code"]
    assert note["severity"] == "info" and note["program"] == "encoder" and "aoti-cpu-" in note["message"]
    assert "--trust-native" in note["fix"] and "--require-signature" in note["fix"]
    human = pt2reg("verify", aoti.path)
    assert "native-code" in human.stdout and "--trust-native" in human.stdout

    r = pt2reg("verify", aoti.path, "--trust-native", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["variants"]["encoder"]["id"].startswith("aoti-cpu-")
    (note,) = [f for f in doc["findings"] if f["code"] == "native-code"]
    assert note["severity"] == "warning" and "allowed by --trust-native" in note["message"]

    r = pt2reg("run", aoti.path, "--samples", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["variants"]["encoder"] == "portable" and doc["ok"]
    assert "native code" in doc["variant_reasons"]["encoder"]
    assert doc["native_code"][0]["code"] == "native-code" and "--trust-native" in doc["native_code"][0]["fix"]
    r = pt2reg("run", aoti.path, "--samples")
    assert "note: program 'encoder': AOTInductor variant" in r.stdout and "--trust-native" in r.stdout
    r = pt2reg("run", aoti.path, "--samples", "--json", "--trust-native")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["variants"]["encoder"].startswith("aoti-cpu-") and doc["ok"]

    # signed by a trusted key: the compiled variant is chosen without --trust-native
    push(pt2reg, aoti.path, "team/fast", keys["release"])
    r = pt2reg("run", "team/fast@1", "--samples", "--json")
    assert json.loads(r.stdout)["variants"]["encoder"] == "portable"  # no policy, no key: untrusted
    r = pt2reg("run", "team/fast@1", "--samples", "--json", "--require-signature", keys["release.pub"])
    assert r.exit_code == 0 and json.loads(r.stdout)["variants"]["encoder"].startswith("aoti-cpu-")
    policy(home, rule("team/*", keys["release.pub"]))
    r = pt2reg("verify", "team/fast@1", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["variants"]["encoder"]["id"].startswith("aoti-cpu-")
    (note,) = [f for f in doc["findings"] if f["code"] == "native-code"]
    assert note["severity"] == "info" and "signed by trusted key sha256:" in note["message"]
    r = pt2reg("run", "team/fast@1", "--samples", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["variants"]["encoder"].startswith("aoti-cpu-") and doc["trusted_signers"]
    # a key signing another model does not make this one trusted
    push(pt2reg, aoti.path, "lab/fast", keys["other"])
    assert json.loads(pt2reg("verify", "lab/fast@1", "--json").stdout)["variants"]["encoder"]["id"] == "portable"

    # only native variants and no trust: exit 5, one line saying what to pass
    for cmd in (["verify", only_aoti], ["run", only_aoti, "--samples"]):
        r = pt2reg(*cmd)
        assert r.exit_code == 5, (cmd, r.output)
        line = one_error_line(r)
        assert "program 'encoder' has only AOTInductor variants (native code)" in line
        assert "--trust-native" in line and "--require-signature" in line
    assert pt2reg("verify", only_aoti, "--trust-native").exit_code == 0


@pytest.mark.slow
def test_registry_load_native_choice(aoti, only_aoti, home, tmp_path):
    assert load(aoti.path, cache_dir=tmp_path / "c")["encoder"].variant.id == "portable"
    model = load(aoti.path, cache_dir=tmp_path / "c", trust_native=True)
    assert model["encoder"].variant.kind == "aoti"
    torch.testing.assert_close(model["encoder"](*aoti.inputs["encoder"]), aoti.expected["encoder"])
    with pytest.raises(UnsafeArchiveError, match="only AOTInductor variants"):
        load(only_aoti, cache_dir=tmp_path / "c")


# ------------------------------------------------------------------------------- sandbox

@pytest.fixture
def spawns(monkeypatch) -> list[list[str]]:
    """Every sandbox child started (the real one still runs)."""
    calls: list[list[str]] = []
    real = subprocess.run

    def counting(cmd, *a, **kw):
        if "registry.runtime.sandbox" in cmd:
            calls.append(list(cmd))
        return real(cmd, *a, **kw)

    monkeypatch.setattr(sandbox_mod.subprocess, "run", counting)
    return calls


@pytest.fixture
def sandbox_on(monkeypatch):
    monkeypatch.setenv("PT2REG_SANDBOX", "on")
    for var in ("PT2REG_SANDBOX_MEMORY", "PT2REG_SANDBOX_SECONDS"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.slow
def test_first_load_is_vetted_once_then_cached(home, bundles, spawns, sandbox_on, tmp_path, monkeypatch):
    cache = tmp_path / "c"
    model = load(bundles["ed"], cache_dir=cache)
    (child,) = spawns  # both programs in one child: one python + torch start
    assert child.count("--program") == 2 and {"encoder", "decoder"} <= set(model)
    assert "--memory" in child and "--seconds" in child and "--trust-pickle" not in child
    vetted = sorted((cache / "vetted").iterdir())
    assert len(vetted) == 2 and list(json.loads(vetted[0].read_text())["verdicts"]) == [torch.__version__]
    spawns.clear()
    again = load(bundles["ed"], cache_dir=cache)  # the verdict is cached by digest: no child
    assert spawns == [] and [r.ok for r in again.run_samples()] == [True, True]
    # the off switch
    monkeypatch.setenv("PT2REG_SANDBOX", "off")
    load(bundles["v3"], cache_dir=tmp_path / "off-cache2")
    assert spawns == [] and not (tmp_path / "off-cache2" / "vetted").exists()


@pytest.mark.slow
def test_signed_by_a_trusted_key_skips_the_sandbox(pt2reg, home, bundles, keys, spawns, sandbox_on, tmp_path):
    push(pt2reg, bundles["ed"], "team/signed", keys["release"])
    signed = tmp_path / "signed.pt2b"
    assert pt2reg("pull", "team/signed@1", "-o", signed).exit_code == 0
    load(signed, cache_dir=tmp_path / "c1", require_signature=[str(keys["release.pub"])])
    policy(home, rule("team/*", keys["release.pub"]))
    load("team/signed@1")
    r = pt2reg("run", "team/signed@1", "--samples")
    assert r.exit_code == 0, r.output
    assert spawns == [] and not (home / "cache" / "vetted").exists()
    load(signed, cache_dir=tmp_path / "c2", programs=["decoder"])  # a file, no files=true rule: vetted
    assert len(spawns) == 1


def _bomb_bundle(pt2_dir: Path, bundles: dict[str, Path], dest: Path, elements: int) -> Path:
    """The decoder whose weight declares ``elements`` x 8 floats over an empty member: torch
    allocates and zeroes the whole declared size while deserializing it."""
    cfg = read_json_member(pt2_dir / "decoder.pt2", "data/weights/model_weights_config.json")
    cfg["config"]["out.weight"]["tensor_meta"]["sizes"] = [{"as_int": elements}, {"as_int": 8}]
    bomb = rewrite_pt2(pt2_dir / "decoder.pt2", dest.with_suffix(".pt2"), {
        "data/weights/model_weights_config.json": json.dumps(cfg).encode(), "data/weights/weight_0": b""})
    return bundle_with_raw_member(bundles["v1"], dest, "programs/decoder.pt2", bomb.read_bytes())


def _limit_parent_memory():  # 6 GiB of address space for the CLI under test: torch + margin
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


@pytest.mark.slow
def test_memory_bomb_is_refused_in_the_sandbox_and_the_parent_survives(pt2_dir, bundles, tmp_path, marker,
                                                                        monkeypatch):
    bomb = _bomb_bundle(pt2_dir, bundles, tmp_path / "bomb.pt2b", 2_000_000_000)   # 64 GB of zeros
    # the sandbox itself, on the file torch would read (whatever the other checks decide first)
    src = materialize_file(bomb, tmp_path / "cache")
    spec = src.manifest.programs["decoder"]
    config = sandbox_mod.SandboxConfig(True, tmp_path / "cache" / "vetted", memory=2 << 30, seconds=60)
    with pytest.raises(UnsafeArchiveError) as exc:
        sandbox_mod.vet_program(src, spec, spec.portable, "cpu", config)
    assert "torch ran out of memory deserializing program 'decoder'" in str(exc.value)
    assert "in the sandbox" in str(exc.value) and "PT2REG_SANDBOX_MEMORY" in str(exc.value)
    assert not (tmp_path / "cache" / "vetted").exists()  # a failure is never remembered as vetted
    # through the CLI (a child process, itself limited): exit 5, one line, nothing loaded
    env = {"PT2REG_HOME": str(tmp_path / "home"), "PT2REG_SANDBOX": "on", "PT2REG_SANDBOX_MEMORY": "2G"}
    r = cli_process("run", str(bomb), "--samples", env=env, preexec_fn=_limit_parent_memory, timeout=300)
    assert r.returncode == 5, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "decoder" in lines[0], r.stderr


@pytest.mark.slow
def test_cpu_limit_and_bad_settings(pt2reg, bundles, tmp_path, monkeypatch, sandbox_on, home):
    monkeypatch.setenv("PT2REG_SANDBOX_SECONDS", "1")  # torch's import alone takes longer
    with pytest.raises(UnsafeArchiveError, match=r"torch (used more than its CPU time|took longer than 1 s "
                                                 r"\(wall clock\)) deserializing program 'decoder' of .* in the "
                                                 r"sandbox"):
        load(bundles["v4"], cache_dir=tmp_path / "c")
    assert not (tmp_path / "c" / "vetted").exists()
    r = pt2reg("run", bundles["v4"], "--samples")  # the CLI: exit 5, one line, nothing ran
    assert r.exit_code == 5 and "in the sandbox" in one_error_line(r) and "PT2REG_SANDBOX_SECONDS" in r.stderr
    assert "samples" not in r.stdout and not (home / "cache" / "vetted").exists()
    for var, value in (("PT2REG_SANDBOX_SECONDS", "soon"), ("PT2REG_SANDBOX_MEMORY", "lots"),
                       ("PT2REG_SANDBOX", "maybe")):
        monkeypatch.setenv(var, value)
        with pytest.raises(UsageError, match=var):
            load(bundles["v4"], cache_dir=tmp_path / "c")
        monkeypatch.setenv(var, {"PT2REG_SANDBOX": "on"}.get(var, "60"))


def test_a_crash_in_the_sandbox_names_torch_itself_as_a_possible_cause():
    """torch 2.11's AOTInductor CUDA loader crashed on a benign package (the GPU check on an
    H100): the line must not accuse the file alone, for a signal or a bare exit code."""
    import signal

    for rc, verb in ((-signal.SIGSEGV, "crashed (SIGSEGV)"), (139, "crashed (exit 139)")):
        done = subprocess.CompletedProcess([], rc, stdout="", stderr="Fatal Python error: Segmentation fault\n")
        got, _detail, fix = sandbox_mod._verdict(done, 2 << 30, 60, 1.0)
        assert got == verb and "damaged or hostile" in fix and "this torch's own loader" in fix


@pytest.mark.slow
def test_one_verdict_serves_every_device_and_the_child_never_names_it(home, bundles, spawns, sandbox_on, tmp_path):
    """A portable program is deserialized on the CPU in the child whatever device it will run
    on (the child never starts a GPU), so a verdict taken for one device serves the others."""
    cache = tmp_path / "c"
    load(bundles["v3"], cache_dir=cache, device="cpu")
    (child,) = spawns
    entries = [json.loads(p.read_text())["verdicts"][torch.__version__] for p in (cache / "vetted").iterdir()]
    assert entries and all(e == ["exported_program:model"] for e in entries)
    spawns.clear()
    load(bundles["v3"], cache_dir=cache, device="meta")  # another device: no second child
    assert spawns == []


def test_a_device_the_child_cannot_use_is_exit_4_not_a_verdict_on_the_file(monkeypatch, tmp_path):
    """The child says IncompatibleError (a device or library missing *here*): the parent's
    answer is exit 4 naming it, and nothing is remembered as vetted, nor refused as damaged."""
    from registry.errors import IncompatibleError
    from registry.runtime import torchrt

    def unavailable(*args, **kwargs):
        raise IncompatibleError("cannot load program 'model' on this machine: Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torchrt, "load_exported_program", unavailable)
    monkeypatch.setattr(sandbox_mod, "_set_limits", lambda *a: None)  # the child's limits, not this process's
    argv = ["--program", "exported_program", "model", str(tmp_path / "x.pt2"), "--memory", str(8 << 30),
            "--seconds", "60"]
    assert sandbox_mod._child(argv) == sandbox_mod._RC_INCOMPATIBLE
    done = subprocess.CompletedProcess([], sandbox_mod._RC_INCOMPATIBLE, stdout="",
                                       stderr="IncompatibleError: cannot load program 'model' on this machine: "
                                              "Torch not compiled with CUDA enabled\n")
    monkeypatch.setattr(sandbox_mod.subprocess, "run", lambda *a, **k: done)

    class Src:
        label, digest, trusted_signers = "m.pt2b", "sha256:" + "0" * 64, ()
        manifest = type("M", (), {"members": ()})()

        def member_file(self, member):
            return tmp_path / "x.pt2"

    (tmp_path / "x.pt2").write_bytes(b"x")
    spec = type("Spec", (), {"name": "model", "in_spec": None, "out_spec": None})()
    variant = type("V", (), {"member": "programs/model.pt2", "kind": "exported_program", "archive_name": "model"})()
    config = sandbox_mod.SandboxConfig(True, tmp_path / "vetted")
    with pytest.raises(IncompatibleError, match="cannot load on this machine: .*not compiled with CUDA"):
        sandbox_mod.vet_programs(Src(), [(spec, variant)], "cpu", config)
    assert not (tmp_path / "vetted").exists()


def test_torch_saying_a_device_is_missing_is_exit_4():
    """Wherever torch deserializes (the loader, the child, the bundler), its words for a device
    this machine or build lacks become IncompatibleError, not 'damaged or hostile'."""
    from registry.errors import IncompatibleError
    from registry.runtime.torchrt import torch_loading

    for text in ("Torch not compiled with CUDA enabled", "PyTorch is not linked with support for cuda devices",
                 "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. ...",
                 "CUDA error: invalid device ordinal"):
        with pytest.raises(IncompatibleError, match="on this machine"):
            with torch_loading("program 'model'", "damaged"):
                raise RuntimeError(text)
    with pytest.raises(UnsafeArchiveError.__mro__[1]):  # IntegrityError: anything else is still exit 5
        with torch_loading("program 'model'", "damaged"):
            raise RuntimeError("unexpected EOF in the archive")


def test_verdicts_are_kept_per_torch(tmp_path):
    """Switching torch and back vets nothing again: each torch's verdicts are kept beside the
    others' (and the older one-torch layout is still read)."""
    record = tmp_path / "ab.json"
    record.write_text(json.dumps({"torch": "2.13.0+cpu", "ok": ["exported_program:model"]}))  # the older layout
    assert sandbox_mod._is_vetted(record, "exported_program:model", "2.13.0+cpu")
    assert not sandbox_mod._is_vetted(record, "exported_program:model", "2.14.1")
    sandbox_mod._remember(record, "exported_program:model", "2.14.1")
    sandbox_mod._remember(record, "aoti:model:cuda", "2.14.1")
    for version in ("2.13.0+cpu", "2.14.1"):
        assert sandbox_mod._is_vetted(record, "exported_program:model", version)
    assert sandbox_mod._is_vetted(record, "aoti:model:cuda", "2.14.1")
    assert not sandbox_mod._is_vetted(record, "aoti:model:cuda", "2.13.0+cpu")
    record.write_text("not json")
    assert not sandbox_mod._is_vetted(record, "exported_program:model", "2.14.1")
