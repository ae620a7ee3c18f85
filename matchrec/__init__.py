"""matchrec: SQL:2016 MATCH_RECOGNIZE and complex event recognition for DuckDB and Spark SQL.

    import matchrec
    con = matchrec.connect("events.duckdb")
    cur = con.cursor()
    cur.execute("SELECT * FROM events MATCH_RECOGNIZE (...)")
"""
from matchrec.dbapi import (BINARY, DATETIME, NUMBER, ROWID, STRING, Binary, Connection, Cursor, Date,
                            DateFromTicks, Time, TimeFromTicks, Timestamp, TimestampFromTicks, apilevel, connect,
                            paramstyle, threadsafety)
from matchrec.engine.multi import ManyResult, run_many
from matchrec.errors import (DatabaseError, DataError, Error, IntegrityError, InterfaceError, InternalError,
                             NotSupportedError, OperationalError, ProgrammingError, Warning)

__version__ = "0.1.0"

__all__ = [
    "connect", "run_many", "ManyResult", "Connection", "Cursor", "apilevel", "threadsafety", "paramstyle",
    "Warning", "Error", "InterfaceError", "DatabaseError", "DataError", "OperationalError", "IntegrityError",
    "InternalError", "ProgrammingError", "NotSupportedError",
    "STRING", "BINARY", "NUMBER", "DATETIME", "ROWID", "Date", "Time", "Timestamp", "Binary",
    "DateFromTicks", "TimeFromTicks", "TimestampFromTicks",
]
