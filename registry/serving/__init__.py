"""Hand-off to serving: ``pt2reg compile`` (per-target AOTInductor variants published as a new
version), ``pt2reg export-triton`` (a Triton model repository for the PyTorch backend's
``torch_aoti`` platform) and ``pt2reg materialize`` (a KServe storage-initializer entrypoint).

- ``registry.serving.compile``: compile, check against the golden samples, publish N+1;
- ``registry.serving.triton``: the ``config.pbtxt`` text from the manifest (pure) and the export;
- ``registry.serving.materialize``: ``pt2reg://HOST:PORT/NAME@REF`` to a directory, all checks
  done before anything is written to it.
"""
