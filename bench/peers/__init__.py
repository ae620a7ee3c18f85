"""Drivers for the peer engines. Each runs inside the peer's own virtualenv, reads the CSV
the benchmark wrote and prints one JSON result line; none imports matchrec or bench."""
