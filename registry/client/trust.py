"""The client trust policy: which keys must have signed which models, so consumers cannot forget.

The policy is ``HOME/trust.toml`` (``--home`` / ``PT2REG_HOME``), or the file named by
``PT2REG_TRUST`` (which must then exist: a policy the user pointed at is never silently absent)::

    [[rule]]
    models = "team/*"                      # glob, or a list of globs
    keys = ["/etc/pt2reg/release.pub",     # a public key file (relative: to this file's folder)
            '''-----BEGIN PUBLIC KEY-----
    MCowBQYDK2VwAyEA...
    -----END PUBLIC KEY-----''']           # or the PEM text inline, as `pt2reg key generate` writes it

    [[rule]]
    oci = "ghcr.io/team/**"                # also OCI artifacts pulled from these repositories (HOST/REPO globs)
    keys = ["/etc/pt2reg/release.pub"]

    [[rule]]
    files = true                           # also bundle files given by path (they have no model name)
    keys = ["ci.pub"]
    legacy = true                          # also accept bare-digest signatures (see below)

Globs match the whole model name: ``*`` is any run of characters but ``/`` (one path segment),
``**`` any run including ``/``, ``?`` one character but ``/``. Every rule whose glob matches a
model applies, and each needs a valid signature by at least one of its keys over a statement
that names *this* model and *this* version (an OMS statement, ``registry.format.oms``): a
bundle signed as ``team/debug`` and published again as ``team/m``, or a statement for version 3
served as version 5, satisfies no rule. A bare-digest (legacy) signature, or another OMS
signer's statement that names no model, satisfies a rule only with ``legacy = true``, which
gives up that protection.

Rollback: once this machine has loaded version N of a model under a rule, a version older
than N is refused (exit 5) unless the user pins it by digest (``NAME@sha256:...``), TUF-style;
the newest version seen per model is kept in ``HOME/trust-state.json``.
An OCI artifact (``oci://HOST/REPO@sha256:...``) carries the model name it was pushed as, and the
rules of that name apply; so do the rules whose ``oci`` globs match ``HOST/REPO``, which the user
typed and the artifact cannot change (renaming a model inside an artifact does not escape them). A rule with ``files = true`` applies to bundle files (``pt2reg verify x.pt2b``,
``registry.load("x.pt2b")``) too; without it rules apply to registry refs only, because a file
carries no model name to match. ``pull``, ``verify``, ``run``, ``registry.load`` and
``Registry.materialize`` enforce it before anything is written or deserialized: a matching model
without such a signature is refused with exit 5 naming the model and the missing signer.

A bundle whose signature verifies against a key of a rule that applies to it (or against a
``--require-signature`` key) is *trusted*: its AOTInductor variants (native code) may be chosen
and the sandbox's first-load check is skipped.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SignatureError, UsageError

if TYPE_CHECKING:  # reading a policy (`pt2reg show`) needs no bundle machinery
    from .sources import MaterializedBundle

__all__ = ["ENV_TRUST", "TrustRule", "TrustPolicy", "glob_match", "load_policy", "establish_trust", "STATE_FILE"]

#: under the home: the newest version of each model this machine loaded under a trust rule
STATE_FILE = "trust-state.json"

ENV_TRUST = "PT2REG_TRUST"
_MAX_POLICY_BYTES = 1024 * 1024
_PEM_MARK = "-----BEGIN"


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def glob_match(pattern: str, name: str) -> bool:
    """``team/*`` matches ``team/a`` but not ``team/a/b``; ``team/**`` matches both."""
    return _glob_regex(pattern).match(name) is not None


@dataclass(frozen=True)
class TrustRule:
    index: int                       # 1-based position in the file
    models: tuple[str, ...]
    files: bool
    keys: tuple[str, ...]            # paths (resolved) or inline PEM text
    policy_path: Path
    legacy: bool = False             # bare-digest signatures (which name no model) satisfy it too
    oci: tuple[str, ...] = ()        # HOST/REPO globs of OCI repositories whose artifacts it covers
    #: key id -> (public key, label), loaded when the policy is read (a bad key is a bad policy)
    keyring: Mapping[str, tuple[Any, str]] = dataclasses.field(default_factory=dict, compare=False)

    def applies_to(self, name: str | None, location: str | None = None) -> bool:
        if location is not None and any(glob_match(p, location.lower()) for p in self.oci):
            return True
        if name is None:
            return self.files
        return any(glob_match(p, name) for p in self.models)

    @property
    def where(self) -> str:
        return f"rule {self.index} of {self.policy_path}"

    def key_label(self, source: str) -> str:
        return "an inline key" if source.lstrip().startswith(_PEM_MARK) else os.path.basename(source)

    def load_keys(self) -> dict[str, tuple[Any, str]]:
        """key id -> (public key, label). A missing or malformed key is a bad policy (exit 2)."""
        from ..format.signing import key_id_of, public_key_from_pem

        out: dict[str, tuple[Any, str]] = {}
        for k, source in enumerate(self.keys, 1):
            what = f"trust policy {self.where}: key #{k}"
            if source.lstrip().startswith(_PEM_MARK):
                data = source.strip().encode("ascii", "replace") + b"\n"
            else:
                try:
                    with open(source, "rb") as f:
                        data = f.read(64 * 1024 + 1)
                except OSError as exc:
                    raise UsageError(f"{what} {source}: {exc.strerror or exc}",
                                     hint="fix the path in the trust policy") from exc
                what = f"{what} {source}"
            key = public_key_from_pem(data, what)
            label = self.key_label(source)
            out[key_id_of(key)] = (key, label)
        return out


@dataclass(frozen=True)
class TrustPolicy:
    """The rules of one trust file (none: an empty policy that requires nothing)."""

    path: Path | None = None
    rules: tuple[TrustRule, ...] = ()

    def rules_for(self, name: str | None, location: str | None = None) -> list[TrustRule]:
        return [r for r in self.rules if r.applies_to(name, location)]

    def verify(self, name: str | None, digest: str, signatures: Iterable[dict[str, Any]],
               label: str = "", version: int | None = None, location: str | None = None) -> tuple[str, ...]:
        """Key ids of the trusted signers; SignatureError (exit 5) when a rule is not met:
        one line naming the model, the rule, the keys and why none of their signatures counts."""
        sigs = list(signatures)
        subject = f"model {name}" if name is not None else f"bundle file {label or digest}"
        signers: list[str] = []
        from ..format.signing import valid_signer

        for rule in self.rules_for(name, location):
            keys = rule.keyring
            signer, why = valid_signer(digest, sigs, {kid: k for kid, (k, _) in keys.items()}, name=name,
                                       version=version, bound=not rule.legacy)
            if signer is None:
                named = ", ".join(f"{lbl} ({kid[:19]}...)" for kid, (_, lbl) in keys.items())
                what = f"{name}@{version}" if name is not None and version is not None else (name or "it")
                raise SignatureError(f"{subject} must be signed by {named} (trust policy {rule.where}): {why}",
                                     hint=f"ask its publisher to sign it: pt2reg sign {what} --key KEY"
                                          + ("" if rule.legacy else " (a statement naming the model and version; "
                                             "legacy = true in the rule also accepts bare-digest signatures)"))
            if signer not in signers:
                signers.append(signer)
        return tuple(signers)

    def labels(self) -> dict[str, str]:
        """key id -> the label of that key in this policy (its file name, or "an inline key")."""
        return {kid: lbl for r in self.rules for kid, (_, lbl) in r.keyring.items()}

    def keys(self) -> dict[str, Any]:
        """key id -> public key, of every rule."""
        return {kid: k for r in self.rules for kid, (k, _) in r.keyring.items()}


def _as_list(value: Any, what: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"trust policy {where}: {what} must be a non-empty string or list of strings")
    return tuple(value)


def parse_policy(text: str, path: Path) -> TrustPolicy:
    """Validate a policy file's text (UsageError, exit 2, one line, for anything wrong)."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"trust policy {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(doc) - {"rule"})
    if unknown:
        raise UsageError(f"trust policy {path}: unknown key {unknown[0]!r}", hint="rules are [[rule]] tables")
    raw_rules = doc.get("rule", [])
    if not isinstance(raw_rules, list):
        raise UsageError(f"trust policy {path}: 'rule' must be an array of tables ([[rule]])")
    rules = []
    for i, raw in enumerate(raw_rules, 1):
        where = f"rule {i} of {path}"
        if not isinstance(raw, dict):
            raise UsageError(f"trust policy {where} is not a table")
        extra = sorted(set(raw) - {"models", "keys", "files", "legacy", "oci"})
        if extra:
            raise UsageError(f"trust policy {where}: unknown key {extra[0]!r}",
                             hint="a rule has models (or oci), keys and optionally files and legacy")
        files, legacy = raw.get("files", False), raw.get("legacy", False)
        for field_name, value in (("files", files), ("legacy", legacy)):
            if not isinstance(value, bool):
                raise UsageError(f"trust policy {where}: {field_name} must be true or false")
        if "models" not in raw and "oci" not in raw and not files:
            raise UsageError(f"trust policy {where} names no models", hint='add models = "team/*"')
        oci = _as_list(raw["oci"], "oci", where) if "oci" in raw else ()
        for o in oci:
            if not re.fullmatch(r"[a-z0-9_.\-/*?:\[\]]+", o.lower()) or "/" not in o:
                raise UsageError(f"trust policy {where}: {o!r} is not an OCI repository glob",
                                 hint='write HOST/REPOSITORY globs, e.g. oci = "ghcr.io/team/**"')
        models = _as_list(raw["models"], "models", where) if "models" in raw else ()
        for m in models:
            if not re.fullmatch(r"[a-z0-9_.\-/*?]+", m):
                raise UsageError(f"trust policy {where}: {m!r} is not a model name glob",
                                 hint="model names are lowercase letters, digits, - _ . /; globs add * ** ?")
        if "keys" not in raw:
            raise UsageError(f"trust policy {where} names no keys", hint='add keys = ["/path/to/release.pub"]')
        keys = []
        for k in _as_list(raw["keys"], "keys", where):
            if k.lstrip().startswith(_PEM_MARK):
                keys.append(k)
            else:
                p = Path(k).expanduser()
                keys.append(str(p if p.is_absolute() else (path.parent / p)))
        r = TrustRule(i, models, files, tuple(keys), path, legacy, tuple(o.lower() for o in oci))
        rules.append(dataclasses.replace(r, keyring=r.load_keys()))
    return TrustPolicy(path, tuple(rules))


def load_policy(home: str | os.PathLike, env: Mapping[str, str] | None = None) -> TrustPolicy:
    """The policy in force: ``PT2REG_TRUST`` (must exist), else ``HOME/trust.toml`` if present."""
    env = os.environ if env is None else env
    named = env.get(ENV_TRUST)
    path = Path(named).expanduser() if named else Path(home) / "trust.toml"
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_POLICY_BYTES + 1)
    except FileNotFoundError:
        if named:
            raise UsageError(f"trust policy {path} (from {ENV_TRUST}) does not exist",
                             hint=f"create it, or unset {ENV_TRUST}") from None
        return TrustPolicy()
    except OSError as exc:
        raise UsageError(f"trust policy {path}: {exc.strerror or exc}") from exc
    if len(data) > _MAX_POLICY_BYTES:
        raise UsageError(f"trust policy {path} is over 1 MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"trust policy {path} is not UTF-8") from exc
    return parse_policy(text, path.resolve())


def establish_trust(src: MaterializedBundle, policy: TrustPolicy | None = None, *,
                    require_signature: Iterable[str] = (), is_file: bool = False, pinned: bool = False,
                    state_dir: str | os.PathLike | None = None) -> MaterializedBundle:
    """Enforce ``policy`` and ``require_signature`` on a MaterializedBundle, before anything is
    deserialized; return it with ``trusted_signers`` set (SignatureError, exit 5, otherwise).

    ``is_file``: the bundle was given as a file, so only ``files = true`` rules apply. With
    ``state_dir`` (the home), a model a rule covers may not go back to a version older than
    the newest loaded here before, unless ``pinned`` (the user named its digest): rollback.
    """
    signers = list(src.trusted_signers)
    name = None if is_file else src.name   # no model name: it is checked as a file
    if policy is not None:
        for s in policy.verify(name, src.digest, src.signatures, label=src.label, version=src.version,
                               location=src.location):
            if s not in signers:
                signers.append(s)
        if name is not None and src.version is not None and state_dir is not None and policy.rules_for(name, src.location):
            _check_rollback(Path(state_dir) / STATE_FILE, name, src.version, pinned)
    pubkeys = list(require_signature)
    if pubkeys:
        from ..format.signing import verify_signatures

        s = verify_signatures(src.digest, src.signatures, pubkeys, name=name, version=src.version)
        if s not in signers:
            signers.append(s)
    if tuple(signers) == tuple(src.trusted_signers):
        return src
    return dataclasses.replace(src, trusted_signers=tuple(signers))


def _check_rollback(path: Path, name: str, version: int, pinned: bool) -> None:
    """Refuse ``name@version`` when a newer version of it was loaded here under a trust rule
    (SignatureError, exit 5), unless ``pinned``; else remember ``version`` if it is the newest."""
    import json

    try:
        doc = json.loads(path.read_text("utf-8"))
        models = doc.get("models") if isinstance(doc, dict) else None
    except (OSError, ValueError):
        models = None
    models = models if isinstance(models, dict) else {}
    entry = models.get(name)
    newest = entry.get("version") if isinstance(entry, dict) and isinstance(entry.get("version"), int) else 0
    if version < newest and not pinned:
        raise SignatureError(f"model {name}: version {version} is older than version {newest}, which this machine "
                             f"already loaded signed (a rollback, refused by the trust policy)",
                             hint=f"to go back on purpose, pin it by digest: {name}@sha256:... "
                                  f"(`pt2reg show {name}@{version}` prints it)")
    if version > newest:
        from ..atomic import atomic_write

        models[name] = {"version": version}
        try:
            with atomic_write(path, fsync=False) as f:
                f.write(json.dumps({"models": models}, indent=1, sort_keys=True).encode("utf-8"))
        except OSError:
            pass  # a read-only home: no state kept (each process then checks only the policy)
