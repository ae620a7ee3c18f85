"""Connectors: where events live (DuckDB is the embedded default)."""
