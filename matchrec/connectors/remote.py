"""The compute node's side of disaggregated storage: ``RemoteStore``, storage nodes read with a
pull strategy.

The parts live elsewhere: the Flight wire (connections, retries and backoff, tokens and TLS,
errors naming the node) in ``connectors.flight_transport``, the ``Source`` interface and the
storage nodes as one source (``NodeSource``: catalogue, typed operations) in
``connectors.source``, and the pull strategies - the dual-filtering rounds and their cost model -
over any source in ``connectors.dual_filtering``. ``RemoteStore`` is a ``NodeSource`` that reads
with those strategies; this module keeps the names other modules import from it.
"""
from __future__ import annotations

import pyarrow as pa

from matchrec.connectors.dual_filtering import (ROUND_TRIPS, STRATEGIES, DualFiltering, join_filters, join_payload,
                                                skip_join_round, tis_payload)
from matchrec.connectors.flight_transport import DEFAULT_BACKOFF, MAX_BACKOFF, FlightTransport, Node, NodeTraffic
from matchrec.connectors.source import LocalSource, NodeSource, PullStats, Source
from matchrec.planner.intervals import IntervalPlan

__all__ = ["DEFAULT_BACKOFF", "MAX_BACKOFF", "ROUND_TRIPS", "STRATEGIES", "DualFiltering", "FlightTransport",
           "LocalSource", "Node", "NodeSource", "NodeTraffic", "PullStats", "RemoteStore", "Source"]


class RemoteStore(NodeSource):
    """Storage nodes, read with the pull strategies of ``connectors.dual_filtering``. The payload
    encoders are looked up on the class at each read, so a subclass (or a test) may choose
    other encodings."""

    _tis_payload = staticmethod(tis_payload)
    _join_payload = staticmethod(join_payload)
    _join_filters = staticmethod(join_filters)
    _skip_join_round = staticmethod(skip_join_round)

    def filtering(self) -> DualFiltering:
        return DualFiltering(self, self._tis_payload, self._join_payload)

    def pull(self, table: str, strategy: str, columns: list[str], row_filter: str | None,
             ip: IntervalPlan | None, round_trips: str, stats: PullStats) -> pa.Table:
        return self.filtering().pull(table, strategy, columns, row_filter, ip, round_trips, stats)

    def filter_rounds(self, table: str, columns: list[str] | None, ip: IntervalPlan, exact: bool, round_trips: str,
                      stats: PullStats, session: str | None = None) -> tuple[dict, list[bytes]]:
        return self.filtering().filter_rounds(table, columns, ip, exact, round_trips, stats, session)

    def _dual_filter(self, table: str, columns: list[str], ip: IntervalPlan, exact: bool, round_trips: str,
                     stats: PullStats, session: str | None = None) -> pa.Table:
        return self.filtering().dual_filter(table, columns, ip, exact, round_trips, stats, session)
