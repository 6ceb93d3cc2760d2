"""Issue 41, class 3: signatures name what they sign (OpenSSF Model Signing v1.0 statements).

Hostile fixtures: a bundle release-signed as ``team/debug`` re-published as ``team/m`` (the
signature travels inside the bundle file), ``prod`` rolled back to an older signed version, a
statement for another version, a legacy bare-digest signature, a forged statement. Each was
loaded as *trusted* before (native code allowed, sandbox skipped); now each is refused with one
line naming the model, the rule and the fix. Interoperability: the ``model_signing`` library's
own verifier accepts our signatures over ``materialize --layout files``, and ours accept the
signatures it makes (as statements that name no model).
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from registry.format.signing import generate_keypair, sign_digest
from tests.cli_inprocess import invoker, one_error_line


@pytest.fixture
def home(clean_home: Path) -> Path:
    return clean_home


@pytest.fixture
def keys(tmp_path) -> dict[str, Path]:
    out = {}
    for name, kind in (("release", "ecdsa-p256"), ("other", "ecdsa-p256"), ("old", "ed25519")):
        key, pub = generate_keypair(tmp_path / "keys" / name, kind)
        out[name], out[f"{name}.pub"] = key, pub
    return out


def _rule(home: Path, pub: Path, extra: str = "") -> None:
    (home / "trust.toml").write_text(f'[[rule]]\nmodels = "team/*"\nkeys = ["{pub}"]\n{extra}')


def _push(pt2reg, bundle: Path, name: str, *args) -> dict:
    r = pt2reg("push", bundle, "--name", name, *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_a_signed_version_verifies_and_says_who_signed(home, bundles, keys):
    pt2reg = invoker(home)
    _push(pt2reg, bundles["ed"], "team/m", "--sign", keys["release"], "--alias", "prod")
    _rule(home, keys["release.pub"])
    r = pt2reg("verify", "team/m@prod", "--json")
    assert r.exit_code == 0, r.output
    (sig,) = json.loads(r.stdout)["signatures"]
    assert sig["text"] == "signed by release.pub (OMS, team/m@1): verified" and sig["kind"] == "OMS"
    show = json.loads(pt2reg("show", "team/m@1", "--json").stdout)["signatures"]
    assert show[0]["verified"] and show[0]["model"] == "team/m" and show[0]["version"] == 1
    listed = json.loads(pt2reg("list", "team/m", "--json").stdout)["versions"][0]["signatures"]
    assert listed[0]["text"] == sig["text"]
    assert "signed by release.pub (OMS, team/m@1): verified" in pt2reg("show", "team/m@1").stdout


def test_a_signature_carried_to_another_model_is_refused(home, bundles, keys, tmp_path):
    pt2reg = invoker(home)
    _push(pt2reg, bundles["ed"], "team/debug", "--sign", keys["release"])
    assert pt2reg("pull", "team/debug@1", "-o", tmp_path / "debug.pt2b").exit_code == 0
    _push(pt2reg, tmp_path / "debug.pt2b", "team/m", "--alias", "prod")   # its signatures.json travels along
    _rule(home, keys["release.pub"])
    for ref in ("team/m@prod", "team/m@1", "team/m"):
        for command in (("verify", ref), ("run", ref, "--samples"), ("pull", ref, "-o", tmp_path / "x.pt2b")):
            r = pt2reg(*command)
            assert r.exit_code == 5, (command, r.output)
            line = one_error_line(r)
            assert "model team/m must be signed by release.pub" in line
            assert "names model team/debug, not team/m" in line and "pt2reg sign team/m@1 --key KEY" in line
    assert not (tmp_path / "x.pt2b").exists()
    import registry
    from registry.errors import SignatureError

    with pytest.raises(SignatureError, match="names model team/debug"):
        registry.load("team/m@prod", device="cpu")


def test_a_statement_for_another_version_is_refused(home, bundles, keys, tmp_path):
    """The same bundle published twice (two model names share a digest): a statement naming
    version 2 of team/m does not vouch for another model's version of the same bytes."""
    pt2reg = invoker(home)
    _push(pt2reg, bundles["v1"], "team/m")
    _push(pt2reg, bundles["v2"], "team/m", "--sign", keys["release"])
    from registry.client import Registry
    from registry.config import Settings
    from registry.errors import ConflictError

    with Registry(Settings.resolve()) as reg:
        forged = dict(reg.meta.signatures("team/m", 2)[0].to_json())
        digest1 = reg.resolve("team/m@1").digest
        forged["digest"] = digest1        # the record claims version 1's digest; the statement says v2
        with pytest.raises(ConflictError, match="names team/m@2, but this is team/m@1"):
            reg.meta.add_signature("team/m", 1, forged, actor="mallory", host="h")
    _direct_insert(home, "team/m", 1, forged)   # whoever can write the database directly
    _rule(home, keys["release.pub"])
    r = pt2reg("verify", "team/m@1")
    assert r.exit_code == 5 and "covers another bundle" in one_error_line(r)


def test_rollback_to_an_older_signed_version_is_refused_unless_pinned(home, bundles, keys):
    pt2reg = invoker(home)
    _push(pt2reg, bundles["v1"], "team/m", "--sign", keys["release"])
    v2 = _push(pt2reg, bundles["v2"], "team/m", "--sign", keys["release"], "--alias", "prod")
    _rule(home, keys["release.pub"])
    assert pt2reg("verify", "team/m@prod").exit_code == 0          # version 2 seen here, signed
    v1 = json.loads(pt2reg("show", "team/m@1", "--json").stdout)["digest"]
    assert pt2reg("alias", "set", "team/m", "prod", "1").exit_code == 0    # a stolen alias token
    for ref in ("team/m@prod", "team/m@1"):
        r = pt2reg("verify", ref)
        assert r.exit_code == 5, r.output
        line = one_error_line(r)
        assert "version 1 is older than version 2" in line and "rollback" in line and "pin it by digest" in line
    assert pt2reg("verify", f"team/m@{v1}").exit_code == 0        # on purpose: pinned by digest
    assert pt2reg("verify", f"team/m@{v2['digest']}").exit_code == 0
    state = json.loads((home / "trust-state.json").read_text())
    assert state["models"]["team/m"]["version"] == 2


def test_legacy_signatures_verify_but_satisfy_a_rule_only_when_it_says_so(home, bundles, keys):
    pt2reg = invoker(home)
    info = _push(pt2reg, bundles["v3"], "team/old")
    from registry.client import Registry
    from registry.config import Settings

    with Registry(Settings.resolve()) as reg:   # a signature made before statements: the bare digest
        reg.meta.add_signature("team/old", 1, sign_digest(keys["old"], info["digest"]), actor="ci", host="h")
    assert pt2reg("verify", "team/old@1", "--require-signature", keys["old.pub"]).exit_code == 0
    _rule(home, keys["old.pub"])
    r = pt2reg("verify", "team/old@1")
    assert r.exit_code == 5 and "only a legacy signature" in one_error_line(r) and "legacy = true" in r.stderr
    _rule(home, keys["old.pub"], "legacy = true\n")
    r = pt2reg("verify", "team/old@1", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["signatures"][0]["text"] == "signed by old.pub (legacy): verified"
    # signing again with the same key upgrades it to a statement (one signature per key)
    assert pt2reg("sign", "team/old@1", "--key", keys["old"]).exit_code == 0
    (sig,) = json.loads(pt2reg("show", "team/old@1", "--json").stdout)["signatures"]
    assert sig["kind"] == "OMS" and sig["version"] == 1


def test_forged_and_malformed_statements_are_refused(home, bundles, keys):
    pt2reg = invoker(home)
    _push(pt2reg, bundles["v4"], "team/f", "--sign", keys["release"])
    from registry.client import Registry
    from registry.config import Settings
    from registry.errors import SignatureError

    with Registry(Settings.resolve()) as reg:
        good = reg.meta.signatures("team/f", 1)[0].to_json()
        bundle = json.loads(good["signature"])
        payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        payload["predicate"]["pt2reg"]["model"] = "team/other"        # edited after signing
        bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
        (home / "forged.json").write_text(json.dumps(bundle))
        from registry.format.oms import open_bundle
        from registry.format.signing import public_key_from_pem

        pub = public_key_from_pem(keys["release.pub"].read_bytes(), "release")
        with pytest.raises(SignatureError, match="does not verify"):
            open_bundle(json.dumps(bundle), pub)
        other = public_key_from_pem(keys["other.pub"].read_bytes(), "other")
        with pytest.raises(SignatureError, match="names another public key"):
            open_bundle(good["signature"], other)
        for broken in ("{", "[]", json.dumps({**bundle, "mediaType": "x"}), "x" * (2 << 20)):
            with pytest.raises(SignatureError):
                open_bundle(broken, pub)
        with pytest.raises(SignatureError, match="is not an oms-v1 Sigstore bundle"):
            reg.meta.add_signature("team/f", 1, {**good, "signature": "not json"}, actor="m", host="h")


def test_model_signing_verifies_ours_and_ours_verify_its(home, bundles, keys, tmp_path):
    ms_signing = pytest.importorskip("model_signing.signing")
    ms_verifying = pytest.importorskip("model_signing.verifying")
    pt2reg = invoker(home)
    info = _push(pt2reg, bundles["ed"], "team/m", "--sign", keys["release"])
    model_dir = tmp_path / "files"
    assert pt2reg("materialize", "team/m@1", model_dir, "--layout", "files").exit_code == 0
    from registry.client import Registry
    from registry.config import Settings

    with Registry(Settings.resolve()) as reg:
        ours = reg.meta.signatures("team/m", 1)[0]
    (tmp_path / "ours.sig").write_text(ours.signature)
    # theirs verifies ours, over the directory `materialize --layout files` writes
    ms_verifying.Config().use_elliptic_key_verifier(public_key=keys["release.pub"]).verify(model_dir, tmp_path / "ours.sig")
    (model_dir / "samples" / "encoder.0.safetensors").write_bytes(b"changed")
    with pytest.raises(ValueError, match="Hash mismatch|Signature mismatch"):
        ms_verifying.Config().use_elliptic_key_verifier(public_key=keys["release.pub"]).verify(
            model_dir, tmp_path / "ours.sig")
    # ours verify theirs: a statement over the same directory, which names no model of ours
    clean = tmp_path / "clean"
    assert pt2reg("materialize", "team/m@1", clean, "--layout", "files").exit_code == 0
    ms_signing.Config().use_elliptic_key_signer(private_key=keys["other"]).sign(clean, tmp_path / "theirs.sig")
    from registry.format.signing import key_id_of, public_key_from_pem

    kid = key_id_of(public_key_from_pem(keys["other.pub"].read_bytes(), "other"))
    with Registry(Settings.resolve()) as reg:
        reg.meta.add_signature("team/m", 1, {"algorithm": "oms-v1", "key_id": kid, "digest": info["digest"],
                                             "signature": (tmp_path / "theirs.sig").read_text()}, actor="ci", host="h")
    r = pt2reg("verify", "team/m@1", "--require-signature", keys["other.pub"], "--json")
    assert r.exit_code == 0, r.output
    theirs = next(s for s in json.loads(r.stdout)["signatures"] if s["key_id"] == kid)
    assert theirs["verified"] and theirs["model"] is None and theirs["text"] == "signed by other.pub (OMS): verified"
    _rule(home, keys["other.pub"])        # a rule wants the model named: theirs names none
    r = pt2reg("verify", "team/m@1")
    assert r.exit_code == 5 and "an OMS statement that names no model" in one_error_line(r)


def _direct_insert(home: Path, name: str, number: int, sig: dict) -> None:
    """A signature row written straight into the database, past every check of the store."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from registry.store.orm import ModelRow, SignatureRow, VersionRow

    engine = create_engine(f"sqlite:///{home / 'registry.db'}")
    with Session(engine) as s:
        vid = s.scalar(select(VersionRow.id).join(ModelRow, ModelRow.id == VersionRow.model_id)
                       .where(ModelRow.name == name, VersionRow.number == number))
        s.add(SignatureRow(version_id=vid, key_id=sig["key_id"], algorithm=sig["algorithm"],
                           signature=sig["signature"], created_at="2026-12-04T00:00:00.000000Z"))
        s.commit()
    engine.dispose()


def test_signing_through_a_server_needs_push_and_is_audited(home, bundles, keys, tmp_path):
    from tests.cli_inprocess import run_in_process
    from tests.services_server import make_token, registry_server

    db, store = f"sqlite:///{home / 'registry.db'}", f"file://{home / 'store'}"
    pt2reg = invoker(home)
    _push(pt2reg, bundles["v5"], "team/s")
    pusher = make_token(db, "trainer", ["model:team/*:pull,push"])
    reader = make_token(db, "inference", ["model:team/*:pull"])
    with registry_server(db, store, log_dir=tmp_path / "server") as running:
        def remote(token: str, *args):
            return run_in_process(*args, env={"PT2REG_URL": running.url, "PT2REG_TOKEN": token, "PT2REG_DB": None,
                                              "PT2REG_STORE": None, "PT2REG_HOME": str(tmp_path / "client")})

        r = remote(reader, "sign", "team/s@1", "--key", keys["release"])
        assert r.returncode == 7 and "push" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        r = remote(pusher, "sign", "team/s@1", "--key", keys["release"], "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["algorithm"] == "oms-v1"
        r = remote(reader, "audit", "--model", "team/s", "--json")
        events = json.loads(r.stdout)["events"] if r.returncode == 0 else []
    _rule(home, keys["release.pub"])
    assert pt2reg("verify", "team/s@1").exit_code == 0
    audit = json.loads(pt2reg("audit", "--model", "team/s", "--json").stdout)["events"]
    signs = [e for e in audit if e["action"] == "sign"]
    assert len(signs) == 1 and signs[0]["actor"] == "trainer" and signs[0]["details"]["algorithm"] == "oms-v1"
    assert events == [] or any(e["action"] == "sign" for e in events)
