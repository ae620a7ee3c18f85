"""What the Spark entry points (``matchrec.spark``) and the Spark connectors share: the DataFrames
matchrec persisted on the user's behalf, and their release.

It sits below both, so interval filtering (``spark_filtering``) caches its input here without
importing the public Spark module that calls it.
"""
from __future__ import annotations

import gc

from matchrec.connectors.spark_metrics import before_cache

_CACHED: list = []  # DataFrames matchrec persisted; they back the DataFrames it returned


def cache(df):
    """Persist ``df`` (memory, spilling to disk) until ``release()``."""
    from pyspark import StorageLevel  # imported on use: `import matchrec` must not need pyspark

    before_cache(df)
    out = df.persist(StorageLevel.MEMORY_AND_DISK)
    _CACHED.append(out)
    return out


def release() -> int:
    """Unpersist what matchrec cached for the DataFrames it returned (the time split caches its
    input and the candidate matches; interval filtering caches its input). Call it when those
    DataFrames are no longer needed; returns how many were released."""
    n = len(_CACHED)
    while _CACHED:
        df = _CACHED.pop()
        if not _stopped(df):  # a stopped session's cache went with it; its unpersist would fail
            df.unpersist()
    # pyspark's own objects form reference cycles (schema closures, Py4J proxies), so the JVM side of
    # a finished statement's DataFrames (their plans, local relations converted by the optimiser)
    # stays alive until Python's cyclic collector runs, which few Python allocations rarely trigger:
    # repeated run_many calls over a 334k-row local table filled a 1 GB driver heap in ten calls
    gc.collect()
    return n


def _stopped(df) -> bool:
    try:
        return bool(df.sparkSession.sparkContext._jsc.sc().isStopped())
    except Exception:  # the gateway or the context is gone
        return True
