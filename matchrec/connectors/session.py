"""Query sessions of the ``dfs_stateful`` strategy on a shard: what a node remembers between rounds.

A session belongs to one MATCH_RECOGNIZE input read by one compute node. For every pattern
variable that had a candidate round it keeps the row ids of the rows that survived all of the
round's filters (condition, time interval set, join filters) together with their partition hash,
key and any join values computed for them, so a later round or the final pull works on those
rows only and never evaluates the variable's condition again.

Sessions live in memory: a restarted node has none, and a request naming a variable the node
should remember fails with ``SessionLost`` (the compute node turns it into an error naming the
node; it never guesses). A session is dropped after its final pull, after ``ttl`` seconds
without a request, or when ``max_sessions`` newer ones exist.
"""
from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

DEFAULT_TTL = 600.0
DEFAULT_MAX_SESSIONS = 64
_ID = re.compile(r"^[0-9a-f]{16,64}$")


class SessionLost(Exception):
    """The state a request relies on is not on this node (restart, expiry or eviction)."""


@dataclass
class VariableState:
    rows: pa.Table  # r (row id), pk, t, then x0, x1, ...: values computed for these rows
    columns: dict[str, str] = field(default_factory=dict)  # SQL of a computed value -> its column

    def keep(self, mask: np.ndarray) -> None:
        if not mask.all():
            self.rows = self.rows.filter(pa.array(mask))


@dataclass
class Session:
    table: str
    version: tuple  # what identified the table's contents when the session began
    variables: dict[int, VariableState] = field(default_factory=dict)
    touched: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class SessionStore:
    def __init__(self, ttl: float = DEFAULT_TTL, max_sessions: int = DEFAULT_MAX_SESSIONS):
        self.ttl = ttl
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, sid, table: str, version: tuple, expect: list[int]) -> Session:
        """The session ``sid``, created when ``expect`` names no variable. The caller holds the
        session's lock while it reads or changes the session."""
        if not isinstance(sid, str) or not _ID.match(sid):
            raise ValueError("session id must be 16-64 lowercase hex digits")
        now = time.monotonic()
        with self._lock:
            for old in [k for k, s in self._sessions.items() if now - s.touched > self.ttl]:
                del self._sessions[old]
            session = self._sessions.get(sid)
            if session is None:
                if expect:
                    raise SessionLost(f"query session {sid[:12]} is not known here: the node restarted, or the "
                                      f"session expired ({self.ttl:.0f} s) or was evicted. Run the query again")
                session = Session(table, version)
                self._sessions[sid] = session
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
            self._sessions.move_to_end(sid)
            session.touched = now
        if session.table != table:
            raise ValueError("a query session reads one table")
        if session.version != version:
            self.drop(sid)
            raise SessionLost(f"table {table} changed on this node during the query. Run the query again")
        missing = [i for i in expect if i not in session.variables]
        if missing:
            raise SessionLost(f"query session {sid[:12]} has no candidates of variable(s) {missing} here. "
                              "Run the query again")
        return session

    def drop(self, sid) -> None:
        with self._lock:
            self._sessions.pop(sid, None)
