"""OCI delivery: the distribution spec's client, credentials, and the ModelPack form of a version.

* ``reference``: ``HOST/REPO[:TAG][@sha256:...]`` values (pure);
* ``modelpack``: a version as a CNCF ModelPack artifact and back (pure);
* ``auth``: credentials where docker, podman and skopeo keep them, and challenges;
* ``client``: ``OciClient``, the distribution spec over ``httpx`` (auth, retries, uploads, referrers);
* ``blobs``: ``OciBlobStore``, an artifact's layers as a read-only ``BlobStore`` for pulls.

``registry.client.oci`` composes them with a ``Registry`` (push a version, open an artifact).
"""
from .reference import OciReference

__all__ = ["OciReference"]
