"""The ``.pt2b`` bytes: the manifest, the bundle file, zip safety and deterministic zip writing,
chunking and signing. Pure: no torch, no database, no network. A second implementer of the format
reads this package and ``schema/`` only."""
