"""The graph language: the YAML schema (spec), its loader (yamlio), the Python builder, ports and the IR."""
