"""The `.pt2b` bundle file: safe zip reading, deterministic zip writing, bundle read/write."""
