"""The match timeline: where matches lie in time, per partition.

``timeline(result, time=..., partition=..., match=..., classifier=...)`` takes the rows of an
``ALL ROWS PER MATCH`` query with ``MATCH_NUMBER()`` and ``CLASSIFIER()`` measures (a matchrec cursor, an
Arrow table or reader, a pandas or polars DataFrame) and draws one lane per partition: each match is a bar
from its first to its last row, each matched row a tick coloured by its variable, and the input rows no
match took (``WITH UNMATCHED ROWS``: NULL match number) as faint ticks::

    cur.execute('''SELECT * FROM ev MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts
                   MEASURES MATCH_NUMBER() AS match_number, CLASSIFIER() AS classifier
                   ALL ROWS PER MATCH WITH UNMATCHED ROWS PATTERN (A B+) DEFINE ...)''')
    matchrec.plot.timeline(cur, time="ts", partition="k").save("matches.html")

The chart is built with Altair (Vega-Lite) and rendered to a static SVG by vl-convert, so the HTML file
is self-contained (no script, nothing fetched when it is opened). Both come with ``matchrec[plot]``.
"""
from __future__ import annotations

import html
import pathlib
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from matchrec import errors as E

MATCH_NAMES = ("match_number", "match_num", "match_no", "match", "mno")
CLASSIFIER_NAMES = ("classifier", "cls", "var", "variable", "label")
TIME_NAMES = ("ts", "time", "timestamp", "event_time", "t")
BAR_CLASS = "match_bars"  # the SVG group of the match bars is <g class="... match_bars_marks">
BAR_LABEL = "match"  # every match bar's aria-label starts with "match "


@dataclass
class Timeline:
    """A drawn timeline: ``save(path)`` (.html or .svg), ``to_svg()``, ``to_html()``, ``chart`` (Altair)."""

    chart: Any
    matches: int
    partitions: int
    partitions_shown: int
    columns: dict = field(default_factory=dict)
    _svg: str | None = None

    def to_svg(self) -> str:
        if self._svg is None:
            import vl_convert
            self._svg = vl_convert.vegalite_to_svg(self.chart.to_dict())
        return self._svg

    def to_html(self, title: str = "matchrec: match timeline") -> str:
        shown = (f"{self.partitions_shown} of {self.partitions} partitions" if self.partitions_shown < self.partitions
                 else f"{self.partitions} partition{'s' if self.partitions != 1 else ''}")
        return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(title)}</title></head>\n"
                "<body style=\"margin:16px;font-family:sans-serif;background:white\">\n"
                f"<div class=\"matchrec-timeline\" data-matches=\"{self.matches}\">"
                f"<p>{self.matches} match{'es' if self.matches != 1 else ''}, {shown}</p>\n"
                f"{self.to_svg()}\n</div>\n</body></html>\n")

    def _repr_html_(self) -> str:
        return self.to_html()

    def save(self, path: str | pathlib.Path) -> pathlib.Path:
        path = pathlib.Path(path)
        suffix = path.suffix.lower()
        if suffix not in (".html", ".htm", ".svg"):
            raise E.ProgrammingError(f"The timeline is written as .html or .svg, not {path.suffix or 'no suffix'}")
        text = self.to_svg() if suffix == ".svg" else self.to_html()
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as err:
            raise E.OperationalError(f"Cannot write {path}: {err.strerror or err}") from None
        return path


def timeline(result: Any, *, time: str | None = None, partition: str | None = None, match: str | None = None,
             classifier: str | None = None, max_partitions: int = 40, width: int = 720,
             title: str | None = None) -> Timeline:
    """Draw the matches of a query result on a timeline (see the module's documentation).

    Column names left out are found by name: ``match`` among match_number/match/mno, ``classifier`` among
    classifier/cls/var; ``time`` as the column just before those measures (ALL ROWS PER MATCH gives the
    PARTITION BY columns, the ORDER BY columns, then the measures), else the first DATE/TIMESTAMP column or
    one named ts/time; ``partition`` as the column just before the time column.
    Only the first ``max_partitions`` partitions (in sort order) are drawn.
    """
    alt = _altair()
    table = _as_table(result)
    names = table.column_names
    for role, name in (("time", time), ("match", match), ("classifier", classifier), ("partition", partition)):
        if name is not None and name not in names:
            raise E.ProgrammingError(f"The result has no column {name!r} for the {role} "
                                     f"(columns: {', '.join(names)})")
    match = match or _find(names, MATCH_NAMES, "match number", "MATCH_NUMBER() AS match_number")
    classifier = classifier or _find(names, CLASSIFIER_NAMES, "classifier", "CLASSIFIER() AS classifier")
    time = time or _find_time(table, min(names.index(match), names.index(classifier)))
    if partition is None:
        position = names.index(time)
        before = names[position - 1] if position > 0 else None
        partition = before if before not in (None, match, classifier) else None
    if max_partitions < 1:
        raise E.ProgrammingError("max_partitions must be at least 1")

    frame, time_type, partitions, lanes_shown = _rows(table, time, partition, match, classifier, max_partitions)
    lane = alt.Y("lane:N", title=partition or "", sort=lanes_shown, axis=alt.Axis(labels=partition is not None))
    x_title = time
    matched = alt.datum.match != None  # noqa: E711 - a Vega expression, not a Python comparison
    base = alt.Chart(alt.Data(values=frame))
    bars = (base.transform_filter(matched)
            .transform_aggregate(start="min(t)", end="max(t)", rows="count()", groupby=["lane", "match"])
            .transform_calculate(label=f"'{BAR_LABEL} ' + datum.match + ' in ' + datum.lane + ': ' + "
                                       "datum.rows + ' rows'")
            .mark_bar(height=16, color="#e3e8ee", stroke="#aab4be", strokeWidth=1, cornerRadius=2)
            .encode(x=alt.X(f"start:{time_type}", title=x_title), x2="end", y=lane,
                    description=alt.Description("label:N"),
                    tooltip=[alt.Tooltip("lane:N", title=partition or "partition"), "match:Q",
                             alt.Tooltip(f"start:{time_type}"), alt.Tooltip(f"end:{time_type}"), "rows:Q"]))
    bars = bars.properties(name=BAR_CLASS)
    rows_in_matches = (base.transform_filter(matched)
                       .mark_tick(thickness=3, size=14)
                       .encode(x=alt.X(f"t:{time_type}", title=x_title), y=lane,
                               color=alt.Color("variable:N", title="CLASSIFIER()"),
                               description=alt.Description("variable:N")))
    unmatched = (base.transform_filter(~matched)
                 .mark_tick(thickness=1, size=10, color="#9aa0a6", opacity=0.35)
                 .encode(x=alt.X(f"t:{time_type}", title=x_title), y=lane))
    layers = [unmatched, bars, rows_in_matches]
    shown = len(lanes_shown)
    heading = title or "Matches per partition"
    if shown < partitions:
        heading += f" (first {shown} of {partitions} partitions)"
    chart = alt.layer(*layers).properties(width=width, height=alt.Step(24), title=heading)
    match_count = len({(r["lane"], r["match"]) for r in frame if r["match"] is not None})
    return Timeline(chart, match_count, partitions, shown,
                    {"time": time, "partition": partition, "match": match, "classifier": classifier})


def _altair():
    try:
        import altair
        import vl_convert  # noqa: F401 - the SVG renderer; checked before any work
    except ImportError:
        raise E.NotSupportedError("The timeline needs Altair and vl-convert: pip install 'matchrec[plot]'") from None
    return altair


def _as_table(result: Any) -> pa.Table:
    if callable(getattr(result, "fetch_arrow_table", None)):  # a matchrec (or DuckDB) cursor
        return result.fetch_arrow_table()
    if isinstance(result, pa.Table):
        return result
    if isinstance(result, pa.RecordBatchReader):
        return result.read_all()
    if hasattr(result, "to_arrow") and callable(result.to_arrow):  # polars
        return result.to_arrow()
    if type(result).__module__.startswith("pandas"):
        return pa.Table.from_pandas(result, preserve_index=False)
    raise E.ProgrammingError("timeline() takes a matchrec cursor, an Arrow table or reader, or a pandas or "
                             f"polars DataFrame, not {type(result).__name__}")


def _find(names: list[str], candidates: tuple[str, ...], what: str, measure: str) -> str:
    lowered = {n.lower(): n for n in names}
    for candidate in candidates:
        if candidate in lowered:
            return lowered[candidate]
    raise E.ProgrammingError(f"The result has no {what} column: add MEASURES {measure} with ALL ROWS PER MATCH, "
                             f"or name the column (columns: {', '.join(names)})")


def _find_time(table: pa.Table, first_measure: int) -> str:
    # ALL ROWS PER MATCH gives the PARTITION BY columns, the ORDER BY columns, then the measures
    if first_measure > 0:
        candidate = table.schema.field(first_measure - 1)
        if any(check(candidate.type) for check in (pa.types.is_timestamp, pa.types.is_date, pa.types.is_integer,
                                                   pa.types.is_floating, pa.types.is_decimal)):
            return candidate.name
    for f in table.schema:
        if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type):
            return f.name
    lowered = {n.lower(): n for n in table.column_names}
    for candidate in TIME_NAMES:
        if candidate in lowered:
            return lowered[candidate]
    raise E.ProgrammingError("The result has no DATE or TIMESTAMP column nor one named ts or time: name the time "
                             f"column with time=... (columns: {', '.join(table.column_names)})")


def _rows(table: pa.Table, time: str, partition: str | None, match: str, classifier: str, max_partitions: int):
    """The plotted rows (lane, t, match, variable), the time type for Vega-Lite (T or Q), the number of
    partitions and the lanes drawn."""
    time_type_arrow = table.schema.field(time).type
    if pa.types.is_timestamp(time_type_arrow) or pa.types.is_date(time_type_arrow):
        time_type = "T"
        times = pc.cast(table[time], pa.timestamp("ms")) if pa.types.is_date(time_type_arrow) else table[time]
        times = [None if v is None else v.isoformat() for v in times.to_pylist()]
    elif pa.types.is_integer(time_type_arrow) or pa.types.is_floating(time_type_arrow) or \
            pa.types.is_decimal(time_type_arrow):
        time_type = "Q"
        times = [None if v is None else float(v) for v in table[time].to_pylist()]
    else:
        raise E.DataError(f"The time column {time!r} is {time_type_arrow}: it must be a number, DATE or TIMESTAMP")
    if not (pa.types.is_integer(table.schema.field(match).type) or pa.types.is_null(table.schema.field(match).type)):
        raise E.DataError(f"The match column {match!r} must hold MATCH_NUMBER() values (integers), "
                          f"not {table.schema.field(match).type}")
    lanes = ["" if v is None else str(v) for v in table[partition].to_pylist()] if partition else \
        [""] * table.num_rows
    ordered = sorted(set(lanes))
    kept = ordered[:max_partitions]
    keep = set(kept)
    matches = table[match].to_pylist()
    variables = table[classifier].to_pylist()
    frame = [{"lane": lane, "t": t, "match": m, "variable": v}
             for lane, t, m, v in zip(lanes, times, matches, variables) if lane in keep and t is not None]
    return frame, time_type, len(ordered), kept
