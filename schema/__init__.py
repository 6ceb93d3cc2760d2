"""JSON Schema of the bundle manifest; shipped in the wheel as ``registry._schema``."""
