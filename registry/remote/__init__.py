"""A registry server as the two stores ``Registry`` runs on (``registry.client.ports``).

``--registry URL`` / ``PT2REG_URL`` makes ``Registry`` use these instead of a database and a
blob store: the client then needs only the URL and a token (``credentials``), never a database
URL or cloud credentials.

* ``http``: one pooled ``httpx`` client per ``Registry``: the bearer token (to the server's
  own origin only), retries, and the server's JSON errors rebuilt as the same ``RegistryError``;
* ``meta``: ``HttpMetadataStore``, the ``MetadataStore`` protocol over the ``/v1`` routes;
* ``blobs``: ``HttpBlobStore``, the ``BlobStore`` protocol, bytes straight to and from the
  URLs the server hands out (presigned S3, or its own route over a local store);
* ``wire``: records <-> JSON, shared with the server;
* ``credentials``: which token is sent, and ``pt2reg login``'s file (mode 0600).
"""
