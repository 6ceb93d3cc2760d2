"""The registry client: publish, resolve, pull, lifecycle, lineage, audit and gc over a
metadata store and a blob store (``registry.client.ports``). The CLI, training and inference
code call this; it never hands out sessions or rows.

    >>> with Registry() as reg:                                              # doctest: +SKIP
    ...     reg.push("model.pt2b", "team/bert", aliases=["staging"], run_id="run-42")
    ...     src = reg.materialize("team/bert@staging")   # verified files in the local cache
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Settings, actor, hostname
from ..errors import NotFoundError, RegistryError, UsageError
from ..refs import Ref, validate_alias, validate_name

# The push, pull and gc paths (the bundle format, the cache, the transfers) are imported by the
# methods that use them: `pt2reg list` / `show` load none of them (tests/integration/test_cli_imports.py).
if TYPE_CHECKING:
    from ..access.policy import AliasPolicy
    from ..blobs.base import ProgressFn
    from ..oci.reference import OciReference
    from ..remote.http import HttpClient
    from ..store.audit_chain import ChainVerdict
    from ..store.records import (
        AliasRecord,
        AttestationRecord,
        AuditEvent,
        LineageNode,
        ModelRecord,
        SignatureRecord,
        TokenRecord,
        VersionRecord,
        WebhookDelivery,
        WebhookRecord,
    )
    from .gc import GcResult
    from .oci import OciArtifact, OciPushResult, OciReferrer
    from .ports import BlobStore, MetadataStore
    from .pull import Located, PullResult
    from .push import PushResult
    from .sources import AuditSpool, BlobCache, MaterializedBundle
    from .trust import TrustPolicy

__all__ = ["Registry", "parse_time"]


class Registry:
    """One registry: a metadata store + a blob store + this machine's cache and trust policy.

    Built from ``Settings`` (``PT2REG_*`` or the defaults), or from explicitly given stores
    (any ``MetadataStore`` / ``BlobStore``: a remote client fits here). The metadata store is
    opened on first use and closed by ``close()`` or at the end of a ``with`` block.
    """

    def __init__(self, settings: Settings | None = None, *, meta: MetadataStore | None = None,
                 blobs: BlobStore | None = None, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.settings = settings or Settings.resolve()
        self._meta = meta
        self._blobs = blobs
        self._http: HttpClient | None = None  # remote mode: one pooled connection to the server
        self._closed = False
        self.cache_dir = Path(cache_dir) if cache_dir is not None else self.settings.cache_dir
        self._spool_path = self.settings.home / "audit-spool.jsonl"
        self._spool_flushed = False
        self._policy: TrustPolicy | None = None

    @cached_property
    def cache(self) -> BlobCache:
        """This machine's blob cache (``cache_dir``)."""
        from .sources import BlobCache

        return BlobCache(self.cache_dir)

    @cached_property
    def _spool(self) -> AuditSpool:
        from .sources import AuditSpool

        return AuditSpool(self._spool_path)

    # -- wiring ---------------------------------------------------------------------------
    @property
    def meta(self) -> MetadataStore:
        if self._closed:
            raise UsageError("this Registry is closed", hint="open a new Registry()")
        if self._meta is None and self.settings.remote:
            from ..remote.meta import HttpMetadataStore

            self._meta = HttpMetadataStore(self._client())
        elif self._meta is None:
            from ..store import open_metadata_store

            store = open_metadata_store(self.settings.db_url, auto_create=self.settings.embedded_db)
            store.secret_sealer = _home_key_sealer(self.settings.home)
            self._meta = store
        if not self._spool_flushed:  # the first contact appends what was served from the cache alone
            meta, self._spool_flushed = self._meta, True
            if self._spool_path.exists():  # (checked here too: most commands never load the spool's module)
                self._spool.flush(lambda e: meta.record_event(
                    e["action"], actor=e["actor"], host=e["host"], model=e.get("model"), number=e.get("number"),
                    digest=e.get("digest"), ref=e.get("ref"), details={"served_from_cache_at": e.get("at")}))
        return self._meta

    @property
    def blobs(self) -> BlobStore:
        if self._blobs is None and self.settings.remote:
            from ..remote.blobs import HttpBlobStore

            self._blobs = HttpBlobStore(self._client())
        elif self._blobs is None:
            from ..blobs import open_blob_store

            self._blobs = open_blob_store(self.settings.store_url)
        return self._blobs

    def _client(self) -> HttpClient:
        """The HTTP client of a remote registry (``settings.url``), shared by its two stores."""
        if self._closed:
            raise UsageError("this Registry is closed", hint="open a new Registry()")
        if self._http is None:
            from ..remote.credentials import token_and_source
            from ..remote.http import HttpClient

            assert self.settings.url is not None
            token, source = token_and_source(self.settings)
            self._http = HttpClient(self.settings.url, token, token_source=source)
        return self._http

    @property
    def trust_policy(self) -> TrustPolicy:
        """The client trust policy (``HOME/trust.toml`` or ``PT2REG_TRUST``; see registry.client.trust)."""
        if self._policy is None:
            from .trust import load_policy

            self._policy = load_policy(self.settings.home)
        return self._policy

    def close(self) -> None:
        """Close the metadata store; idempotent. A closed Registry refuses further database
        work. (Its database connections are closed; the engine and its compiled statements stay
        with the process for the next Registry on the same database: ``store.engine.kept_engine``.)"""
        meta, self._meta, self._closed = self._meta, None, True
        http, self._http = self._http, None
        if meta is not None:
            meta.close()
        if http is not None:
            http.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publish --------------------------------------------------------------------------
    def push(self, bundle: str | os.PathLike[str], name: str, *, aliases: Sequence[str] = (),
             parents: Sequence[str] = (), datasets: Sequence[str] = (), run_id: str | None = None,
             git_commit: str | None = None, code_uri: str | None = None, detect_git: bool = True,
             sign_key: str | os.PathLike[str] | None = None, progress: ProgressFn | None = None) -> PushResult:
        """Publish a bundle as the next version of ``name``, with its lineage (``parents``
        refs, ``datasets`` ``URI[@sha256:HEX]``, ``run_id``, ``git_commit`` -- by default HEAD
        of the git repository around the working directory -- and ``code_uri``), the
        publisher's python/torch/CUDA and, with ``sign_key``, a signature (an OMS statement
        naming the new version: ``registry.client.sign``). Blobs are uploaded first; the
        version, lineage and audit event are recorded in one transaction
        (``registry.client.push``) with its aliases and, with ``sign_key``, the signature: a
        statement naming the number the version gets (made before the publish: a publish that
        gets another number, another push having come first, is refused whole, exit 6)."""
        from .provenance import lineage_edges, publisher_environment

        edges = lineage_edges(self.resolve, parents=parents, datasets=datasets, run_id=run_id,
                              git_commit=git_commit, code_uri=code_uri, detect_git=detect_git)
        validate_name(name)
        for a in aliases:
            validate_alias(a)
        if sign_key:
            from ..format.signing import load_private_key

            load_private_key(sign_key)  # a bad key fails before anything is uploaded
        from ..format.bundle import BundleFile
        from ..parallel import gc_held
        from ..pt2.verdicts import verdicts_dir
        from .push import push_bundle

        with gc_held():  # per-chunk records of a program with many tensors (parallel.gc_held)
            opened = BundleFile.open(bundle)
            signatures = []
            if sign_key:  # a statement naming the number this version gets (checked in the publish)
                from .sign import member_digests, sign_record

                members = member_digests(opened.manifest, lambda p: (opened.path, *opened.member_span(p)))
                number = self._number_for(name, opened.digest)
                signatures.append(sign_record(sign_key, name, number, opened.digest, members))
            return push_bundle(lambda: self.meta, self.blobs, opened, name, aliases=aliases, lineage=edges,
                               signatures=signatures, environment=publisher_environment(), progress=progress,
                               vetted_dir=verdicts_dir(self.cache_dir))  # bundle's and load's verdicts

    def _number_for(self, name: str, digest: str) -> int:
        """The number ``digest`` has, or will get as ``name``'s next version: what a signature
        made before the publish names (a publish that gets another number, because another
        came first, is refused whole: ``store.writes.check_claimed_versions``)."""
        try:
            return self.meta.resolve(Ref(name, digest=digest)).number
        except NotFoundError:
            pass
        try:
            numbers = [v.number for v in self.meta.list_versions(name)]
        except NotFoundError:
            numbers = []
        return max(numbers, default=0) + 1

    def sign(self, ref: str | Ref, key_path: str | os.PathLike[str]) -> SignatureRecord:
        """Sign the version ``ref`` names (an OMS statement naming it) and record the signature,
        audited (``registry.client.sign``)."""
        from .sign import sign_version

        return sign_version(self, ref, key_path)

    # -- resolve and fetch ----------------------------------------------------------------
    def resolve(self, ref: str | Ref) -> VersionRecord:
        return self.meta.resolve(ref if isinstance(ref, Ref) else Ref.parse(ref))

    def locate(self, ref: str | Ref) -> Located:
        """Resolve ``ref`` once: a digest pin already cached whole (and resolved under this
        model name before) needs no database, nor does one whose manifest is cached when the
        store is local (its weights left in place: ``fetch_pinned``); anything else is looked up."""
        from .pull import Located

        parsed = ref if isinstance(ref, Ref) else Ref.parse(ref)
        manifest = self.cache.pinned(parsed)
        if manifest is not None:
            cached = self.cache.pinned_bundle(parsed, manifest)
            if cached is not None:
                return Located(parsed, cached=cached)
            if self.blobs.maps_in_place:  # a local store: no database needed
                pin = self.cache.pinned_manifest(parsed, manifest, self.blobs.url)
                if pin is not None:
                    return Located(parsed, pinned=pin)
        return Located(parsed, version=self.meta.resolve(parsed))

    def enforce_trust(self, src: MaterializedBundle, *, require_signature: Sequence[str] = (),
                      pinned: bool = False) -> MaterializedBundle:
        """``src`` with the trust policy (its ``files = true`` rules for a bundle with no model
        name) and the ``require_signature`` keys checked (SignatureError, exit 5), its
        ``trusted_signers`` set. ``pinned``: the user named its digest, so an older signed
        version than one seen here before is what they asked for (no rollback refusal)."""
        from .trust import establish_trust

        return establish_trust(src, self.trust_policy, require_signature=require_signature,
                               is_file=src.name is None, pinned=pinned, state_dir=self.settings.home)

    def open_file(self, path: str | os.PathLike[str], *, progress: ProgressFn | None = None,
                  require_signature: Sequence[str] = ()) -> MaterializedBundle:
        """A bundle file verified into the cache, the trust policy's file rules and the
        ``require_signature`` keys enforced."""
        from .sources import materialize_file

        return self.enforce_trust(materialize_file(path, self.cache_dir, progress),
                                  require_signature=require_signature)

    def materialize(self, ref: str | Ref | Located, *, progress: ProgressFn | None = None,
                    record: str | None = "pull", require_signature: Sequence[str] = (),
                    defer_weights: bool = False,
                    in_place: Callable[[MaterializedBundle], bool] | None = None,
                    trust: bool = True) -> MaterializedBundle:
        """Resolve ``ref`` (once) and make every member a verified file in the local cache.

        The trust policy is enforced first: a model a rule names must carry a valid signature
        by one of its keys (SignatureError, exit 5, before any blob is fetched); the result's
        ``trusted_signers`` lists the trusted keys that signed it. ``require_signature`` (public
        key paths): one of them must have signed it too, checked at the same point. ``record``
        is the audit action (None: none).

        ``defer_weights`` (a cold load, ``registry.load``): the result may be ``pending``, its
        program members' raw weight bytes still being fetched and verified in the background
        (``client.fetch.fetch_members_deferred``); the caller must ``settled()`` it (or
        ``pending.abort()``) while this registry is open. The audit record is written once
        every member is complete. ``in_place`` (with ``defer_weights``; default: always): whether
        the weights of this bundle (trust enforced) may be verified and used where they lie in a
        local store rather than copied (``blobs.inplace``): not when the caller will want the
        files complete before deserializing (the loader's first-load sandbox). ``trust=False``
        (``pt2reg sign``, which makes the signature a policy asks for): no trust policy.
        """
        from ..parallel import gc_held
        from .pull import Located, fetch_pinned, fetch_version

        where = ref if isinstance(ref, Located) else self.locate(ref)

        def enforce(src: MaterializedBundle) -> MaterializedBundle:
            if not trust:
                return src
            return self.enforce_trust(src, require_signature=require_signature, pinned=where.ref.is_pinned)

        if where.cached is not None:
            src = enforce(where.cached)
        elif where.pinned is not None:
            with gc_held():
                src = fetch_pinned(where.pinned, where.ref, self.blobs, self.cache, enforce_trust=enforce,
                                   progress=progress, defer_weights=defer_weights, in_place=in_place)
        else:
            assert where.version is not None
            with gc_held():  # per-chunk records of a program with many tensors (parallel.gc_held)
                src = fetch_version(self.meta, self.blobs, self.cache, where.version,
                                    enforce_trust=enforce, progress=progress, defer_weights=defer_weights,
                                    in_place=in_place)
        if record:
            def audit(src: MaterializedBundle = src, action: str = record) -> None:
                self._audit(src, str(where.ref), action)

            if src.pending is not None:
                src.pending.on_success(audit)   # a pull that fails mid-way is not recorded
            else:
                audit()
        return src

    def _audit(self, src: MaterializedBundle, ref: str, action: str) -> None:
        """Record that ``src`` was fetched (``pull``): in the shared log, or in the spool when it
        was served without the database or the database refuses for now (written at the next
        contact)."""
        if src.version is None and self._meta is None:  # served without the database
            self._spool.append(action, actor=actor(), host=hostname(), model=src.name, digest=src.digest, ref=ref)
            return
        try:
            self.meta.record_event(action, actor=actor(), host=hostname(), model=src.name,
                                   number=src.version, digest=src.digest, ref=ref)
        except NotFoundError:
            pass  # the version went away meanwhile: nothing true to record
        except (RegistryError, OSError):  # refused for now (a server's rate limit, 429), down:
            # the bytes were fetched and verified; the log gets the event at the next contact
            self._spool.append(action, actor=actor(), host=hostname(), model=src.name, digest=src.digest, ref=ref)

    def describe(self, ref: str | Ref | OciReference, *, require_signature: Sequence[str] = ()) -> MaterializedBundle:
        """The version ``ref`` names from metadata alone: its manifest (checked against its
        digest) and signatures, the trust policy and ``require_signature`` enforced, no member
        fetched unless the cache holds them all already (then they come along). What
        ``pt2reg verify --target FILE REF`` checks a runtime against before any download. An
        ``oci://HOST/REPO@sha256:...`` is read from its OCI registry's manifest and bundle layer."""
        from ..oci.reference import OciReference, looks_like_oci
        from .pull import describe_version
        from .sources import MaterializedBundle

        if isinstance(ref, OciReference) or (isinstance(ref, str) and looks_like_oci(ref)):
            from .oci import describe_artifact

            where_oci = ref if isinstance(ref, OciReference) else OciReference.parse(ref)
            return describe_artifact(self, where_oci, require_signature=require_signature)[1]
        where = self.locate(ref)

        def enforce(src: MaterializedBundle) -> MaterializedBundle:
            return self.enforce_trust(src, require_signature=require_signature, pinned=where.ref.is_pinned)

        if where.cached is not None:
            return enforce(where.cached)
        if where.pinned is not None:
            pin = where.pinned
            return enforce(MaterializedBundle(pin.manifest, {}, pin.signatures, label=str(where.ref),
                                              name=where.ref.name))
        assert where.version is not None
        return describe_version(self.meta, where.version, enforce_trust=enforce)

    def pull(self, ref: str | Ref | Located, out: str | os.PathLike[str], *, progress: ProgressFn | None = None,
             require_signature: Sequence[str] = ()) -> PullResult:
        """Rebuild the bundle file for ``ref`` at ``out``, verifying every member on the way.

        With ``require_signature`` (public key paths), the version must carry a valid signature
        by one of them. Both it and the trust policy are enforced before any blob is fetched
        (exit 5 naming the model and the missing signer). Every byte is written once, into
        ``out`` (``client.pull.pull_direct``), each chunk checked against its sha256 as it is
        written; the cache records where the members lie verified in ``out``, so a pinned ref
        pulled or loaded again is served from there (without the database) while ``out`` is
        unchanged. Members verified on this machine already are copied from where they lie.
        """
        from .pull import Located, pull_direct, rebuild_bundle

        where = ref if isinstance(ref, Located) else self.locate(ref)
        # a cached pin needs the database for its number, status and build record only
        version = where.version or self.meta.resolve(Ref(where.ref.name, digest=where.ref.digest))
        build = self.meta.build_info(version.name, version.number)
        if where.cached is not None:   # every member verified here: copied from where it lies
            src = self.materialize(where, progress=progress, require_signature=require_signature)
            result = rebuild_bundle(src, version, out, build)
            if src.ranges:   # served from a bundle a pull wrote: this file serves it next
                self.cache.remember_bundle(out, src.manifest)
            return result

        def enforce(src: MaterializedBundle) -> MaterializedBundle:
            return self.enforce_trust(src, require_signature=require_signature, pinned=where.ref.is_pinned)

        result = pull_direct(self.meta, self.blobs, self.cache, version, out, build=build, enforce_trust=enforce,
                             progress=progress)
        self._audit(result.source, str(where.ref), "pull")
        return result

    # -- OCI delivery ---------------------------------------------------------------------
    def oci_push(self, ref: str | Ref, target: str | OciReference, *, insecure: bool = False,
                 progress: ProgressFn | None = None, max_layer_size: int | None = None,
                 mount_from: Sequence[str] = ()) -> OciPushResult:
        """Push the version ``ref`` names to an OCI registry (``HOST/REPO[:TAG]``) as a CNCF
        ModelPack artifact, with its signatures and attestations as referrers; record it on the
        version (``registry.client.oci``). Plain HTTP only with ``insecure`` or a loopback host."""
        from ..oci.reference import OciReference
        from .oci import push_version

        where = target if isinstance(target, OciReference) else OciReference.parse(target)
        return push_version(self, str(ref), where, insecure=insecure, progress=progress,
                            max_layer_size=max_layer_size, mount_from=mount_from)

    def oci_open(self, source: str | OciReference, *, insecure: bool = False, allow_tag: bool = False,
                 require_signature: Sequence[str] = (), progress: ProgressFn | None = None) -> OciArtifact:
        """An OCI artifact (``[oci://]HOST/REPO@sha256:...``; a tag only with ``allow_tag``)
        checked against its pin, the trust policy and ``require_signature``, every member a
        verified file in the cache (``source`` of the result: what ``registry.load`` runs)."""
        from ..oci.reference import OciReference
        from .oci import open_artifact

        where = source if isinstance(source, OciReference) else OciReference.parse(source)
        return open_artifact(self, where, insecure=insecure, allow_tag=allow_tag,
                             require_signature=require_signature, progress=progress)

    def oci_pull(self, source: str | OciReference, out: str | os.PathLike[str], *, insecure: bool = False,
                 allow_tag: bool = False, require_signature: Sequence[str] = (),
                 progress: ProgressFn | None = None) -> tuple[OciReference, MaterializedBundle]:
        """The artifact's bundle file written at ``out`` (atomically), checked as ``oci_open``
        checks it: the same bytes ``pull`` writes for the version, each chunk fetched straight
        into its place (``client.oci.pull_direct``). Returns the pinned reference and the
        trusted bundle (its members are not kept in the cache)."""
        from ..oci.reference import OciReference
        from .oci import pull_direct

        where = source if isinstance(source, OciReference) else OciReference.parse(source)
        pinned, src = pull_direct(self, where, out, insecure=insecure, allow_tag=allow_tag,
                                  require_signature=require_signature, progress=progress)
        return pinned, src

    def oci_open_mounted(self, directory: str | os.PathLike[str], bundle_digest: str, *,
                         referrers_from: str | OciReference | None = None, insecure: bool = False,
                         require_signature: Sequence[str] = (), progress: ProgressFn | None = None) -> OciArtifact:
        """An artifact's layers as a Kubernetes image volume (CRI-O), ``podman --mount
        type=artifact`` or ``oras pull`` put them in ``directory``, checked to be the bundle
        ``bundle_digest`` (every blob verified, the trust policy enforced; its signatures read
        from ``referrers_from``, the artifact's pinned reference, when given)."""
        from ..oci.reference import OciReference
        from .oci import open_mounted

        where = referrers_from if referrers_from is None or isinstance(referrers_from, OciReference) \
            else OciReference.parse(referrers_from)
        return open_mounted(self, directory, bundle_digest, referrers_from=where, insecure=insecure,
                            require_signature=require_signature, progress=progress)

    def oci_referrers(self, source: str | OciReference, *, insecure: bool = False, allow_tag: bool = False,
                      keys: Sequence[str] = ()) -> tuple[OciReference, list[OciReferrer]]:
        """The signatures and attestations attached to an OCI artifact (referrers API, or its tag
        fallback), each verified where its key is trusted here or given in ``keys``."""
        from ..oci.reference import OciReference
        from .oci import list_referrers

        where = source if isinstance(source, OciReference) else OciReference.parse(source)
        return list_referrers(self, where, insecure=insecure, allow_tag=allow_tag, keys=keys)

    # -- lifecycle ------------------------------------------------------------------------
    def list_models(self) -> list[ModelRecord]:
        return self.meta.list_models()

    def list_versions(self, name: str) -> list[VersionRecord]:
        return self.meta.list_versions(validate_name(name))

    def set_alias(self, name: str, alias: str, ref: str) -> AliasRecord:
        validate_alias(alias)
        text = ref if "@" in ref or ref.startswith(name) else f"{name}@{ref}"
        target = self.meta.resolve(Ref.parse(text))
        if target.name != name:
            raise UsageError(f"alias {alias!r} of {name!r} cannot point at {target.name}@{target.number}")
        return self.meta.set_alias(name, alias, target.number, actor=actor(), host=hostname(),
                                   ref_for_audit=text)

    def remove_alias(self, name: str, alias: str) -> None:
        self.meta.remove_alias(validate_name(name), alias, actor=actor(), host=hostname(),
                               ref_for_audit=f"{name}@{alias}")

    def set_status(self, ref: str, status: str, reason: str) -> VersionRecord:
        if not reason.strip():
            raise UsageError("a reason is required", hint="pass --reason TEXT")
        version = self.meta.resolve(Ref.parse(ref))
        return self.meta.set_status(version.name, version.number, status, reason,
                                    actor=actor(), host=hostname(), ref_for_audit=ref)

    def show(self, ref: str, *, at: str | None = None) -> VersionRecord:
        """A version; with ``at`` (ISO 8601) and an alias ref, the version the alias held then."""
        parsed = Ref.parse(ref)
        if at is None:
            return self.meta.resolve(parsed)
        if parsed.alias is None:
            raise UsageError("--at needs an alias ref such as NAME@prod",
                             hint="versions and digests never change, so they need no time")
        number = self.meta.alias_at(parsed.name, parsed.alias, parse_time(at))
        if number is None:
            raise NotFoundError(f"alias {parsed.name}@{parsed.alias} did not point anywhere at {at}",
                                what="alias", name=str(parsed))
        return self.meta.resolve(Ref(parsed.name, version=number))

    # -- lineage and audit ----------------------------------------------------------------
    def lineage(self, ref: str, *, descendants: bool = False) -> tuple[VersionRecord, list[LineageNode]]:
        v = self.meta.resolve(Ref.parse(ref))
        walk = self.meta.descendants if descendants else self.meta.ancestors
        return v, walk(v.name, v.number)

    def dataset_lineage(self, uri: str) -> list[LineageNode]:
        from .provenance import parse_dataset

        uri, digest = parse_dataset(uri)
        return self.meta.versions_from_dataset(uri, digest=digest)

    def audit_events(self, *, model: str | None = None, since: str | None = None) -> list[AuditEvent]:
        return self.meta.events(model=validate_name(model) if model else None,
                                since=parse_time(since) if since else None)

    def verify_audit(self) -> ChainVerdict:
        """Re-walk the chain and replay it against the registry's state, then check it still
        holds the newest event this machine saw at its last verification (``audit_anchor``),
        and anchor the newest event now."""
        from ..store import audit_anchor

        verdict = self.meta.verify_audit_chain()
        if not verdict.ok:
            return verdict
        contents = self.meta.verify_version_contents()
        if contents is not None:
            return contents
        path = self.settings.home / audit_anchor.ANCHOR_FILE
        anchors = audit_anchor.load(path)
        # remote: anchored by the server's URL (this machine never sees its database URL)
        key = self.settings.url if self.settings.remote else audit_anchor.anchor_key(self.settings.db_url)
        previous = anchors.get(key)
        head, found = self.meta.audit_hashes([int(previous["seq"])] if previous else [])
        failed = audit_anchor.check(previous, found, str(path))
        if failed is not None:
            return failed
        if head is not None:
            audit_anchor.save(path, anchors, key, head)
        return verdict

    # -- garbage collection ---------------------------------------------------------------
    def gc(self, *, dry_run: bool = False, grace_seconds: float = 0.0) -> GcResult:
        """Delete blobs no version references and no live push has claimed, abort uploads
        dead pushes left half done and release their claims (``registry.store.gc``). Against
        a registry server it runs there (an admin token): each store declares where
        (``PushStore.gc``)."""
        return self.meta.gc(self.blobs, dry_run=dry_run, grace_seconds=grace_seconds, actor=actor(),
                            host=hostname())

    # -- tokens ---------------------------------------------------------------------------
    def create_token(self, owner: str, scopes: Sequence[str], expires: str | None = None
                     ) -> tuple[TokenRecord, str]:
        """Create an API token for ``owner`` with ``scopes`` (``model:<glob>:<actions>``,
        ``audit:read``, ``admin``), expiring after ``expires`` (``30d``, ``12h``, ``90m``,
        ``2w``, or an ISO-8601 time; None: never). Returns ``(record, secret)``: the secret is
        not stored and cannot be shown again. Needs direct database access or an admin token."""
        from ..access.scopes import parse_scope
        from ..access.tokens import parse_expiry, validate_owner

        validate_owner(owner)
        canonical = [parse_scope(text).text for text in scopes]
        if not canonical:
            raise UsageError("a token needs at least one scope",
                             hint="pass --scope, e.g. --scope model:team/*:pull")
        expires_at = parse_expiry(expires, self.meta.db_now()) if expires is not None else None
        return self.meta.create_token(owner, canonical, expires_at=expires_at, actor=actor(),
                                      host=hostname())

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked and expired ones included; never a secret."""
        return self.meta.list_tokens()

    def revoke_token(self, token_id: int) -> TokenRecord:
        """Revoke a token now (NotFoundError for an unknown id)."""
        return self.meta.revoke_token(token_id, actor=actor(), host=hostname())

    # -- governance: alias policies and attestations -------------------------------------------
    def set_policy(self, name: str, alias: str, *, role_scope: str | None = None,
                   require_signature: Sequence[str | os.PathLike[str]] = (),
                   require_attestation: Sequence[str] = (), immutable: bool = False) -> AliasPolicy:
        """Create or replace the policy on ``name@alias`` (``registry.access.policy``);
        ``require_signature``: public key files (``.pub``). Needs direct database access or an
        admin token; audited."""
        from ..format.signing import read_public_key_file

        pems = [read_public_key_file(path) for path in require_signature]  # exit 2/3 before any request
        return self.meta.set_policy(validate_name(name), validate_alias(alias), role_scope=role_scope,
                                    signers=pems, attestations=list(require_attestation),
                                    immutable=immutable, actor=actor(), host=hostname())

    def policies(self, name: str) -> list[AliasPolicy]:
        """The alias policies of model ``name``."""
        return self.meta.policies(validate_name(name))

    def remove_policy(self, name: str, alias: str) -> AliasPolicy:
        """Delete the policy on ``name@alias``; returns it."""
        return self.meta.remove_policy(validate_name(name), validate_alias(alias), actor=actor(),
                                       host=hostname())

    def attestations(self, ref: str | VersionRecord) -> tuple[VersionRecord, list[AttestationRecord]]:
        """The version ``ref`` names (or the version given) and its attestations, oldest first."""
        version = self.meta.resolve(Ref.parse(ref)) if isinstance(ref, str) else ref
        return version, self.meta.attestations(version.name, version.number)

    def record_attestation(self, version: VersionRecord, *, label: str, passed: bool, device: str,
                           target: dict, results: list, error: str | None = None,
                           sign_key: str | os.PathLike[str] | None = None) -> AttestationRecord:
        """Record an attestation of ``version`` (what ``registry.runtime.attest`` measured),
        signed with the Ed25519 ``sign_key`` when given: the signature covers
        ``attestation_digest`` of the statement, and the registry verifies it on record."""
        from ..access.policy import attestation_digest, attestation_statement, validate_label

        validate_label(label)
        signature = public_key = None
        if sign_key is not None:
            from ..format.signing import public_pem_of, sign_digest

            statement = attestation_statement(digest=version.digest, label=label, passed=passed,
                                              device=device, target=target, results=results, error=error)
            signature = sign_digest(sign_key, attestation_digest(statement))
            public_key = public_pem_of(sign_key)
        return self.meta.record_attestation(
            version.name, version.number, label=label, passed=passed, device=device, target=target,
            results=results, error=error, signature=signature, public_key=public_key, actor=actor(),
            host=hostname())

    # -- webhooks -------------------------------------------------------------------------
    def add_webhook(self, url: str, events: Sequence[str], secret_file: str | os.PathLike[str], *,
                    model_glob: str | None = None) -> WebhookRecord:
        """Subscribe ``url`` to ``events`` (``registry.store.outbox.EVENT_TYPES``), only for
        models matching ``model_glob`` when given. ``secret_file`` holds a Standard Webhooks
        secret ``whsec_<base64>``: it is stored encrypted under the server's key (remotely the
        server encrypts it; with direct database access, the key file ``$PT2REG_SIGNING_KEY``
        or HOME/server-signing.key, which must be the server's)."""
        from ..access import server_key
        from ..store.outbox import validate_webhook_url

        validate_webhook_url(url)
        try:
            text = Path(secret_file).read_text("utf-8").strip()
        except OSError as exc:
            raise NotFoundError(f"cannot read the secret file {secret_file}: {exc.strerror}") from exc
        server_key.parse_webhook_secret(text)   # a malformed secret fails here, before any request
        return self.meta.add_webhook(url, list(events), model_glob or None, secret=text, actor=actor(),
                                     host=hostname())

    def list_webhooks(self) -> list[WebhookRecord]:
        return self.meta.list_webhooks()

    def remove_webhook(self, webhook_id: int) -> WebhookRecord:
        return self.meta.remove_webhook(webhook_id, actor=actor(), host=hostname())

    def webhook_deliveries(self, *, failed: bool = False, limit: int = 200) -> list[WebhookDelivery]:
        """Newest first with their attempts; ``failed``: those whose last attempt failed."""
        return self.meta.webhook_deliveries(failed=failed, limit=limit)

    def redeliver_webhook(self, delivery_id: int) -> WebhookDelivery:
        return self.meta.redeliver_webhook(delivery_id)

    # -- the signed audit head ------------------------------------------------------------
    def verify_audit_signed(self, server_key_file: str | os.PathLike[str]) -> ChainVerdict:
        """:meth:`verify_audit`, plus: every stored signed head verifies under the server's
        public key (``server_key_file``, PEM) and the chain still carries each signed hash, so
        a chain recomputed by someone without the key fails naming the first rewritten event."""
        from ..access import server_key
        from ..format.signing import read_public_key_file
        from ..store.audit_chain import ChainVerdict, format_ts

        pem = read_public_key_file(server_key_file).encode("ascii")
        verdict = self.meta.verify_audit_chain()
        if not verdict.ok:
            return verdict
        heads = self.meta.audit_heads()
        seqs = sorted({h.seq for h in heads})
        found: dict[int, str] = {}
        for i in range(0, len(seqs), 5000):
            found.update(self.meta.audit_hashes(seqs[i:i + 5000])[1])
        bad = server_key.check_heads(heads, found, pem, ts_text=format_ts)
        if bad is not None:
            return ChainVerdict(False, bad[0], bad[1])
        verdict = self.verify_audit()
        if verdict.ok and heads:
            newest = heads[-1]
            return verdict._replace(reason=((verdict.reason + "; ") if verdict.reason else "")
                                    + f"signed head at event {newest.seq} ({format_ts(newest.signed_at)}) verified")
        return verdict


def parse_time(text: str) -> datetime:
    """ISO 8601 (``2026-11-22T10:00:00Z``, a date, or with an offset) -> aware UTC datetime."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise UsageError(f"invalid time {text!r}", hint="use ISO 8601, e.g. 2026-11-22T10:00:00Z") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


def _home_key_sealer(home: str | os.PathLike[str]) -> Callable[[str, str], tuple[str, str]]:
    """Seals a webhook secret with direct database access as the server would: internal
    addresses refused (``check_new_target``), then encrypted under the server key file
    (``$PT2REG_SIGNING_KEY`` or HOME/server-signing.key, which must be the server's), loaded only
    when a webhook is added."""
    def seal(url: str, text: str) -> tuple[str, str]:
        from ..access import server_key
        from ..access.webhook_targets import TargetPolicy, check_new_target

        check_new_target(url, TargetPolicy.from_env())  # internal addresses: as the server would (and does)
        path, may_create = server_key.key_path(home)
        key = server_key.load_or_create(path, may_create)
        return server_key.secret_sealer(server_key.secrets_key(key), server_key.server_key_id(key))(url, text)
    return seal
