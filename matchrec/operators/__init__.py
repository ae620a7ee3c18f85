"""Operators: pure computations on in-memory data (pattern programs, matchers, expressions)."""
