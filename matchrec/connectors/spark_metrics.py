"""Shuffle bytes and job counts of the Spark jobs matchrec runs, for EXPLAIN ANALYZE and the
benchmarks, and the report of what one statement did on Spark (``ClauseReport``).

On a classic session a meter reads the application's status store (works with the UI off): it
takes the totals of every stage Spark has recorded when it is created, and ``delta()`` gives
what the stages completed since then wrote and read, and how many jobs started (job ids rise by
one); jobs of other threads in the same application in the meantime would be counted too. A
Spark Connect client has no status store: there every action matchrec runs goes through
``collect``/``count``/``to_arrow`` here, which add the shuffle metrics of the executed plan (its
Exchange nodes) to the meters open at the time, and one to their job count. Those metrics stop
at a cached DataFrame (its plan runs inside the scan of the cache), so while a Connect meter is
open ``before_cache`` runs each DataFrame matchrec is about to cache once on its own, and the
meter sees its shuffles: both sides of a comparison then pay and count the same work.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Shuffle:
    written: int = 0
    read: int = 0
    records: int = 0
    stages: int = 0
    jobs: int = 0  # Spark jobs started (classic: by job id; Connect: the actions matchrec ran)


def is_connect(spark) -> bool:
    """True for a Spark Connect session (no JVM, no SparkContext in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _totals(spark) -> dict[tuple[int, int], tuple[int, int, int]]:
    sc = spark.sparkContext
    jvm = sc._jvm
    store = sc._jsc.sc().statusStore()
    stages = store.stageList(jvm.java.util.ArrayList(), False, False, sc._gateway.new_array(jvm.double, 0),
                             jvm.java.util.ArrayList())
    out = {}
    for i in range(stages.size()):
        st = stages.apply(i)
        out[(st.stageId(), st.attemptId())] = (st.shuffleWriteBytes(), st.shuffleReadBytes(),
                                               st.shuffleWriteRecords())
    return out


def _last_job(spark) -> int:
    """The highest job id the application has started (-1: none): ids rise by one per job."""
    ids = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    return max(ids, default=-1)


_OPEN: list["ShuffleMeter"] = []  # Connect meters taking what actions report


class ShuffleMeter:
    def __init__(self, spark):
        self.spark = spark
        self.connect = is_connect(spark)
        self.seen = Shuffle()
        if self.connect:
            _OPEN.append(self)
        else:
            self.before = _totals(spark)
            self.job0 = _last_job(spark)

    def delta(self) -> Shuffle:
        if self.connect:
            if self in _OPEN:
                _OPEN.remove(self)
            return self.seen
        after = _totals(self.spark)
        s = Shuffle(jobs=_last_job(self.spark) - self.job0)
        for key, (w, r, n) in after.items():
            w0, r0, n0 = self.before.get(key, (0, 0, 0))
            if (w, r, n) != (w0, r0, n0):
                s.written += w - w0
                s.read += r - r0
                s.records += n - n0
                s.stages += 1
        return s


def _observe(df) -> None:
    if not _OPEN:
        return
    for meter in _OPEN:
        meter.seen.jobs += 1
    info = getattr(df, "executionInfo", None)
    metrics = info.metrics if info is not None else None
    if metrics is None:
        return
    got = Shuffle()
    for node in metrics.extract_graph()[1].values():
        values = {m.name: m.value for m in node.metrics}
        if "shuffleBytesWritten" in values:
            got.written += int(values["shuffleBytesWritten"])
            got.records += int(values.get("shuffleRecordsWritten", 0))
            got.read += int(values.get("remoteBytesRead", 0)) + int(values.get("localBytesRead", 0))
            got.stages += 1
    for meter in _OPEN:
        meter.seen.written += got.written
        meter.seen.read += got.read
        meter.seen.records += got.records
        meter.seen.stages += got.stages


def collect(df) -> list:
    rows = df.collect()
    _observe(df)
    return rows


def to_arrow(df):
    table = df.toArrow()
    _observe(df)
    return table


def count(df) -> int:
    """``df.count()``, metered on Connect (where ``count`` runs on a DataFrame of its own)."""
    if not _OPEN:
        return df.count()
    counted = df.groupBy().count()
    rows = counted.collect()
    _observe(counted)
    return int(rows[0][0])


def before_cache(df) -> None:
    """Meter what computing ``df`` shuffles, on Connect while a meter is open (see the docstring)."""
    if _OPEN:
        count(df)


@dataclass
class ClauseReport:
    """What one MATCH_RECOGNIZE or CER statement did on Spark (EXPLAIN and EXPLAIN ANALYZE print it)."""
    mode: str = ""
    lines: list[str] = field(default_factory=list)
    explain: str = ""
    jobs_seconds: float = 0.0
    filtering: object = None  # connectors.spark_filtering.FilterReport when intervals were used
    kind: str = "MATCH_RECOGNIZE"  # or "CER statement"
