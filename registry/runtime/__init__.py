"""The Loader: can this bundle run here, load it, call it."""
