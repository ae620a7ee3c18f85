"""Shuffle bytes of Spark jobs, read from the application's status store (works with the UI off).

A meter takes the totals of every stage Spark has recorded when it is created; ``delta()``
gives what the stages completed since then wrote and read. Jobs of other threads in the same
application in the meantime would be counted too.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Shuffle:
    written: int = 0
    read: int = 0
    records: int = 0
    stages: int = 0


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


class ShuffleMeter:
    def __init__(self, spark):
        self.spark = spark
        self.before = _totals(spark)

    def delta(self) -> Shuffle:
        after = _totals(self.spark)
        s = Shuffle()
        for key, (w, r, n) in after.items():
            w0, r0, n0 = self.before.get(key, (0, 0, 0))
            if (w, r, n) != (w0, r0, n0):
                s.written += w - w0
                s.read += r - r0
                s.records += n - n0
                s.stages += 1
        return s
