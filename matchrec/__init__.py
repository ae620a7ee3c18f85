"""matchrec: SQL:2016 MATCH_RECOGNIZE and complex event recognition for DuckDB and Spark SQL.

    import matchrec
    con = matchrec.connect("events.duckdb")
    cur = con.cursor()
    cur.execute("SELECT * FROM events MATCH_RECOGNIZE (...)")

``import matchrec`` loads only the PEP 249 exception classes (matchrec.errors, plain Python).
Every other exported name, and every submodule, is imported on first use (PEP 562): the
engine pulls in DuckDB, pyarrow, sqlglot and lark, the compiled matcher numba, and a script
that only catches ``matchrec.Error`` or reads ``__version__`` should not pay for them.
"""
from __future__ import annotations

import importlib

from matchrec.errors import (DatabaseError, DataError, Error, IntegrityError, InterfaceError, InternalError,
                             NotSupportedError, OperationalError, ProgrammingError, Warning)

__version__ = "0.1.0"

# exported name -> the module that defines it; resolved by __getattr__ on first access
_LAZY = {
    **dict.fromkeys(("BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Connection", "Cursor", "Date",
                     "DateFromTicks", "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks", "apilevel",
                     "connect", "paramstyle", "threadsafety"), "matchrec.dbapi"),
    "ManyResult": "matchrec.engine.multi",
    "run_many": "matchrec.engine.multi",
    "warm": "matchrec.operators.compiled",
}

__all__ = [
    "connect", "run_many", "ManyResult", "Connection", "Cursor", "apilevel", "threadsafety", "paramstyle",
    "Warning", "Error", "InterfaceError", "DatabaseError", "DataError", "OperationalError", "IntegrityError",
    "InternalError", "ProgrammingError", "NotSupportedError",
    "STRING", "BINARY", "NUMBER", "DATETIME", "ROWID", "Date", "Time", "Timestamp", "Binary",
    "DateFromTicks", "TimeFromTicks", "TimestampFromTicks", "warm",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if not name.startswith("__"):
        # Submodules were attributes of the package once the eager imports had run
        # (``matchrec.dbapi``, ``matchrec.engine``); importing one binds it here too.
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise  # the submodule exists but something it imports is missing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
