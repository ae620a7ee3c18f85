"""The match timeline: its chart structure, its self-contained HTML/SVG, its inputs, the shell's .plot, and
(slow) the page as a headless Chromium renders it."""
from __future__ import annotations

import io
import re
import shutil
import struct
import subprocess
import zlib

import pandas as pd
import polars
import pyarrow as pa
import pytest

import matchrec
from matchrec import plot
from matchrec.shell import Shell

EVENTS = """CREATE TABLE ev AS SELECT i AS ts, TIMESTAMP '2024-03-01 08:00:00' + to_minutes(i) AS at,
            'p' || (i % 3) AS k,
            CASE WHEN i % 11 IN (0, 1, 5) THEN 'A' WHEN i % 11 IN (2, 3, 4, 6) THEN 'B' ELSE 'C' END AS type
            FROM range(200) t(i)"""
BODY = """PARTITION BY k ORDER BY ts MEASURES {measures} {rows} AFTER MATCH SKIP PAST LAST ROW
          PATTERN (A B+) DEFINE A AS type = 'A', B AS type = 'B'"""
ALL_ROWS = ("SELECT * FROM ev MATCH_RECOGNIZE (" + BODY.format(
    measures="MATCH_NUMBER() AS match_number, CLASSIFIER() AS classifier",
    rows="ALL ROWS PER MATCH WITH UNMATCHED ROWS") + ")")
ONE_ROW = "SELECT count(*) FROM ev MATCH_RECOGNIZE (" + BODY.format(measures="FIRST(ts) AS s",
                                                                      rows="ONE ROW PER MATCH") + ")"
BAR = re.compile(r'aria-label="match (\d+) in (p\d): (\d+) rows"')


@pytest.fixture
def events(con):
    con.execute(EVENTS)
    return con


def expected_matches(con) -> int:
    return con.execute(ONE_ROW).fetchone()[0]


def test_one_bar_per_match_and_a_tick_per_row(events):
    drawn = plot.timeline(events.execute(ALL_ROWS))
    assert drawn.columns == {"time": "ts", "partition": "k", "match": "match_number", "classifier": "classifier"}
    matches = expected_matches(events)
    assert matches > 10 and drawn.matches == matches and drawn.partitions == 3
    svg = drawn.to_svg()
    bars = BAR.findall(svg)
    assert len(bars) == matches
    sizes = events.execute("SELECT k, match_number, count(*) FROM (" + ALL_ROWS + ") WHERE match_number "
                           "IS NOT NULL GROUP BY ALL").fetchall()
    assert sorted((k, int(m), int(n)) for m, k, n in bars) == sorted(sizes)
    assert f'class="mark-rect role-mark {plot.BAR_CLASS}_marks"' in svg
    spec = drawn.chart.to_dict()
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["tick", "bar", "tick"]
    assert spec["layer"][2]["encoding"]["color"]["field"] == "variable"
    values = spec["data"]["values"]
    assert len(values) == 200  # every input row: matched rows and the faint unmatched ones
    assert sum(v["match"] is None for v in values) == events.execute(
        "SELECT count(*) FROM (" + ALL_ROWS + ") WHERE match_number IS NULL").fetchone()[0]
    assert {v["variable"] for v in values if v["match"] is not None} == {"A", "B"}


def test_html_is_self_contained(events, tmp_path):
    drawn = plot.timeline(events.execute(ALL_ROWS), title="Runs of A then B")
    path = drawn.save(tmp_path / "matches.html")
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "Runs of A then B" in page
    assert "<script" not in page.lower()
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page)  # nothing fetched when opened
    assert drawn._repr_html_() == page
    svg = drawn.save(tmp_path / "matches.svg").read_text()
    assert svg.startswith("<svg") and len(BAR.findall(svg)) == drawn.matches


def test_every_input_kind_gives_the_same_picture(events):
    table = events.execute(ALL_ROWS).fetch_arrow_table()
    expected = plot.timeline(table).to_svg()
    assert plot.timeline(events.execute(ALL_ROWS).df()).to_svg() == expected
    assert plot.timeline(polars.from_arrow(table)).to_svg() == expected
    assert plot.timeline(events.execute(ALL_ROWS).fetch_record_batch(7)).to_svg() == expected


def test_timestamps_and_named_columns(events):
    query = ALL_ROWS.replace("ORDER BY ts", "ORDER BY at").replace("AS match_number", "AS mno").replace(
        "AS classifier", "AS var_name")
    frame = events.execute(query).df()
    with pytest.raises(matchrec.ProgrammingError, match="no classifier column"):
        plot.timeline(frame)
    drawn = plot.timeline(frame, match="mno", classifier="var_name", time="at", partition="k")
    spec = drawn.chart.to_dict()
    assert spec["layer"][1]["encoding"]["x"]["type"] == "temporal"
    assert drawn.matches == expected_matches(events)
    assert "2024" in drawn.to_svg()


def test_partitions_beyond_the_limit_are_left_out(events):
    drawn = plot.timeline(events.execute(ALL_ROWS), max_partitions=2)
    assert (drawn.partitions, drawn.partitions_shown) == (3, 2)
    bars = BAR.findall(drawn.to_svg())
    assert {k for _, k, _ in bars} == {"p0", "p1"}
    assert "first 2 of 3 partitions" in drawn.to_html()


def test_bad_input_gives_matchrec_errors(events, tmp_path):
    with pytest.raises(matchrec.ProgrammingError, match="no column 'nope' for the time"):
        plot.timeline(events.execute(ALL_ROWS), time="nope")
    with pytest.raises(matchrec.ProgrammingError, match="takes a matchrec cursor"):
        plot.timeline([1, 2, 3])
    with pytest.raises(matchrec.DataError, match="must be a number, DATE or TIMESTAMP"):
        plot.timeline(events.execute(ALL_ROWS), time="type")
    with pytest.raises(matchrec.DataError, match="MATCH_NUMBER"):
        plot.timeline(pa.table({"ts": [1], "match_number": ["x"], "classifier": ["A"]}))
    drawn = plot.timeline(pd.DataFrame({"ts": [1, 2], "match_number": [1, 1], "classifier": ["A", "B"]}))
    assert drawn.partitions == 1 and drawn.matches == 1
    with pytest.raises(matchrec.ProgrammingError, match=r"\.html or \.svg"):
        drawn.save(tmp_path / "x.png")
    with pytest.raises(matchrec.OperationalError, match="Cannot write"):
        drawn.save(tmp_path / "missing" / "x.html")


def test_shell_plot_writes_the_last_results_timeline(events, tmp_path):
    shell = Shell(events, out=io.StringIO(), err=io.StringIO())
    target = tmp_path / "shell.html"
    assert shell.run_script(ALL_ROWS + ";\n.plot " + str(target) + "\n")
    assert f"{expected_matches(events)} matches in 3 partitions written to" in shell.out.getvalue()
    assert len(BAR.findall(target.read_text())) == expected_matches(events)
    shell = Shell(events, out=io.StringIO(), err=io.StringIO())
    assert not shell.run_script(".plot " + str(target) + "\nSELECT 1 AS a;\n.plot x.html partition\n")
    errors = shell.err.getvalue()
    assert "No query to plot" in errors and "Usage: .plot FILE" in errors


def _png_pixels(data: bytes) -> tuple[int, int, int, list[bytearray]]:
    """Width, height, bytes per pixel and the unfiltered rows of an 8-bit, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and interlace == 0
    bpp = {2: 3, 6: 4, 0: 1, 4: 2}[colour]
    raw, stride, rows, previous = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa_, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa_ <= pb and pa_ <= pc else up if pb <= pc else corner)) & 255
        rows.append(line)
        previous = line
    return width, height, bpp, rows


@pytest.mark.slow
def test_chromium_renders_the_bars(events, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "install Debian's chromium (apt-get install chromium) to run the browser test"
    page = plot.timeline(events.execute(ALL_ROWS)).save(tmp_path / "matches.html")
    shot = tmp_path / "shot.png"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run",
              f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,400"]
    subprocess.run(common + [f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True, timeout=120)
    dom = subprocess.run(common + ["--dump-dom", page.as_uri()], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert len(BAR.findall(dom)) == expected_matches(events)
    assert dom.count(f"{plot.BAR_CLASS}_marks") == 1
    width, height, bpp, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 400)
    greys = [sum(row[i:i + 3]) // 3 for row in rows[::4] for i in range(0, width * bpp, bpp * 4)]
    mean = sum(greys) / len(greys)
    variance = sum((g - mean) ** 2 for g in greys) / len(greys)
    assert variance > 50, "the screenshot is blank"
    colours = {tuple(row[i:i + 3]) for row in rows for i in range(0, width * bpp, bpp)}
    assert len(colours) > 20  # bars, ticks in the classifier colours, axes and text


def test_without_the_plot_extra_the_error_names_it(events, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "vl_convert", None)  # as if matchrec[plot] were not installed
    with pytest.raises(matchrec.NotSupportedError, match=r"pip install 'matchrec\[plot\]'"):
        plot.timeline(events.execute(ALL_ROWS))
