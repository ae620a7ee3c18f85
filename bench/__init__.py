"""Benchmarks of matchrec against DuckDB baselines and peer engines; run ``python -m bench``."""
