"""One physical plan per statement, built before anything runs, and one EXPLAIN layout for every
form: MATCH_RECOGNIZE, a window with PATTERN and a CER statement show the same section headings
in the same order; the decision of the compiled matcher's types is a pure function of the plan."""
from __future__ import annotations

import copy
import dataclasses

import duckdb
import pytest

from matchrec.connectors.duckdb_source import DuckDBOracle, describe
from matchrec.engine import reading
from matchrec.engine.session import Session
from matchrec.parser import hidden as H
from matchrec.parser.body import parse_body
from matchrec.parser.spec import Span
from matchrec.planner.fastpath import fast_plan
from matchrec.planner.logical import HEADINGS as LOGICAL_HEADINGS
from matchrec.planner.logical import LogicalPlan
from matchrec.planner.physical import PHYSICAL_HEADINGS, decide_fast_path
from matchrec.planner.plan import build_plan

MR = """SELECT * FROM ev MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts
        MEASURES FIRST(A.ts) AS s, LAST(B.ts) AS e ONE ROW PER MATCH
        PATTERN (A B+) DEFINE A AS v > 0, B AS v > PREV(v) AND B.w > A.w) ORDER BY k, s"""
WINDOW = """SELECT ts, count(*) OVER w AS n FROM ev WINDOW w AS (PARTITION BY k ORDER BY ts
        ROWS BETWEEN CURRENT ROW AND 5 FOLLOWING PATTERN (A B+) DEFINE B AS v > A.v)"""
CER = "PATTERN SEQ(A a, B b) FROM cer WHERE b.v > a.v WITHIN 5 RETURN a.ts, b.ts"


@pytest.fixture
def duck():
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT i % 3 AS k, i AS ts, (i * 7) % 5 AS v, [i % 4, i] AS w "
                "FROM range(200) r(i)")
    con.execute("CREATE TABLE cer AS SELECT i AS ts, CASE WHEN i % 3 = 0 THEN 'A' ELSE 'B' END AS type, "
                "(i * 13) % 11 AS v FROM range(300) r(i)")
    yield con
    con.close()


def headings(text: str) -> list[str]:
    """The section headings of matchrec's EXPLAIN text, in order (``logical:``/``physical:`` and
    the two-space indented ``name:`` lines under them)."""
    out = []
    for line in text.splitlines():
        if line in ("logical:", "physical:"):
            out.append(line)
        elif line.startswith("  ") and not line.startswith("   ") and ":" in line:
            out.append(line[2:].split(":", 1)[0])
    return out


def explain(session: Session, sql: str) -> str:
    rows = session.execute("EXPLAIN " + sql).rows
    assert rows[0][0] == "matchrec"
    return rows[0][1]


def test_every_form_shares_the_section_headings(duck):
    session = Session(duck)
    want = ["logical:", *LOGICAL_HEADINGS, "physical:", *PHYSICAL_HEADINGS]
    texts = {"match_recognize": explain(session, MR), "window": explain(session, WINDOW),
             "cer": explain(session, CER)}
    for form, text in texts.items():
        got = [h for h in headings(text) if h != "program"]
        assert got == want, (form, text)
    assert texts["match_recognize"].startswith("MATCH_RECOGNIZE #1\nlogical:\n")
    assert texts["cer"].startswith("CER pattern SEQ(A a, B b)\nlogical:\n")
    # each form says what its matcher is, why, and on which estimates
    for text in texts.values():
        assert "\n    reason: " in text and "\n    estimates: " in text
    assert "matcher: mechanism batch" in texts["cer"] and "events 300" in texts["cer"]
    assert "matcher: compiled" in texts["match_recognize"]
    assert "one match attempt per row, in its frame" in texts["window"]


def test_analyze_keeps_the_layout_and_adds_the_counts(duck):
    session = Session(duck)
    text = explain(session, "ANALYZE " + CER)
    assert headings(text)[:2] == ["logical:", "source"] and "Analyze: events read" in text
    text = explain(session, "ANALYZE " + MR)
    assert "physical:" in text and "Analyze: rows in 200" in text


def test_the_physical_plan_is_not_changed_by_execution(duck):
    session = Session(duck)
    result = session.execute(MR)
    plan = result.stats[0][0]
    physical = plan.physical
    assert physical is not None and physical.fast is not None
    before = physical.explain()
    session.fetch_table(result)
    session.release(result)
    assert plan.physical is physical and physical.explain() == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        physical.read_sql = "SELECT 1"
    # the read query was built once, from the decided fast plan, with its row filter
    assert H.ROW_MASK in physical.read_sql and physical.read_sql.count("SELECT") >= 1


def test_decide_fast_path_is_pure(duck):
    body = "ORDER BY ts PATTERN (A B) DEFINE B AS B.w > A.w AND B.v > A.v"
    spec = parse_body(body, 0, body, "duckdb", Span(0, len(body)))
    input_sql = "SELECT * FROM ev"
    oracle = DuckDBOracle(duck)
    plan = build_plan(spec, describe(duck, input_sql), oracle)
    fp = fast_plan(plan)
    assert fp is not None and len(fp.compares) + len(fp.programs) >= 1
    original = copy.deepcopy(fp)
    types = reading.probe_types(plan, fp, duck, input_sql, oracle)
    decided, why = decide_fast_path(plan, fp, types, reading.KindRules)
    assert why == "" and decided is not fp
    assert fp == original  # the argument is left as it was
    # w is a list: whatever compares it is left to the reference matcher, v (a number) stays compiled
    assert any("w" in r for r in decided.residual) and not decided.exact
    assert decide_fast_path(plan, fp, types, reading.KindRules)[0] == decided  # the same answer again


def test_one_chooser_for_every_form():
    from matchrec.planner.fastpath import FastPlan
    from matchrec.planner.physical import Semantics, choose_matcher
    exact = FastPlan(row_sql=["x > 1"])
    relaxed = FastPlan(row_sql=["x > 1"], residual=["A: CLASSIFIER()"])
    assert choose_matcher(Semantics("match_recognize", ("A",), exact)).name == "compiled"
    assert choose_matcher(Semantics("match_recognize", ("A",), relaxed)).name == "compiled pre-filter"
    off = choose_matcher(Semantics("match_recognize", ("A",), None, "SET matchrec_fast_path = 0"))
    assert (off.name, off.summary) == ("reference", "reference (SET matchrec_fast_path = 0)")
    assert choose_matcher(Semantics("window", ("A",), exact)).name == "window compiled"
    assert choose_matcher(Semantics("window", ("A",), None)).name == "window reference"
    cer = choose_matcher(Semantics("cer", mechanism="chain", order=("y", "x"), mechanism_reason="AND, stable",
                                   estimates=("events 10",)))
    assert (cer.name, cer.summary, cer.reason, cer.estimates) == ("chain", "mechanism chain, order y, x",
                                                                  "AND, stable", ("events 10",))


def test_both_forms_plan_to_one_logical_plan(duck):
    """A MATCH_RECOGNIZE clause and a CER query carry the same LogicalPlan type, with their form,
    their pattern and their selection strategy (the standard's rows per match and skip, or a CER
    strategy), and the matcher choice reads the form from it."""
    session = Session(duck)
    mr = session.execute(MR)
    mr_plan = mr.stats[0][0].physical
    session.fetch_table(mr)
    session.release(mr)
    cer = session.execute(CER)
    cer_plan = cer.cer_run.physical
    session.fetch_table(cer)
    session.release(cer)
    assert isinstance(mr_plan.logical, LogicalPlan) and isinstance(cer_plan.logical, LogicalPlan)
    assert (mr_plan.logical.form, cer_plan.logical.form) == ("match_recognize", "cer")
    assert mr_plan.logical.pattern[0] == "A B+" and cer_plan.logical.pattern == ("SEQ(A a, B b)",)
    assert mr_plan.logical.strategy[0].startswith("rows: ONE ROW PER MATCH")
    assert cer_plan.logical.strategy == ("skip-till-any-match",)
    assert mr_plan.logical.window == () and cer_plan.logical.window[0].startswith("5")
    assert mr_plan.matcher.name.startswith("compiled") and cer_plan.matcher.name == "batch"
    with pytest.raises(ValueError):
        LogicalPlan("sql", (), (), (), (), (), (), (), ())
