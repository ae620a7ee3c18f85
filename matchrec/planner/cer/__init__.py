"""Plan a CER query: resolve it against the source, compile its predicates, choose how to evaluate it.

This package owns, one module per job,
  * ``plan``: the plan, the session settings (``SET matchrec_cer_...``), the statistics it
    carries and SQL quoting;
  * ``resolve``: name resolution of a ``parser.sase.CerQuery`` against the source's schema (type,
    key and partition columns, the columns predicates and RETURN name), the window in key units,
    and predicates over one variable as DuckDB SQL (evaluated in bulk as boolean masks);
  * ``codegen``: predicates over several variables, aggregates over Kleene variables and RETURN
    projections compiled to Python callables over numpy columns (``planner.cer_vector`` compiles
    conditions to whole-array evaluators);
  * ``estimates``: the statistics the choice rests on: per-type counts (and their change between
    the two halves of the key range) from DuckDB, predicate selectivity from a sample of events,
    the cover of the anchors' intervals;
  * ``costs``: the cost model: per mechanism the estimated seconds of evaluating the pattern;
  * ``choice``: the choice of evaluation mechanism and order, and of the anchors used to read only
    the events that can be in a match (filtering before matching). ``engine.cer`` executes the plan.

The names below are those the rest of matchrec uses as ``planner.cer.<name>``.
"""
from matchrec.planner.cer.choice import (anchors_of, choose_filtering, choose_mechanism, mechanism_support,
                                         pattern_shape, plan_query)
from matchrec.planner.cer.costs import MAX_COST, Model
from matchrec.planner.cer.codegen import (PyCompiler, arithmetic_bounds, combine_bounds, compile_conditions,
                                          compile_projections, fits_int64, int_bounds, python_column)
from matchrec.planner.cer.estimates import (anchor_cover, cost_model, estimate_conditions, gather_stats, interval_cover,
                                            partitioned_cover, rate_changes)
from matchrec.planner.cer.plan import (CER_CHOICES, FILTER_COVER, MECHANISMS, NO_WINDOW, RATE_CHANGE, SAMPLE_ROWS,
                                       SAMPLE_TRIALS, UNIT_SECONDS, WINDOW_BEYOND_KEYS, CerPlan, CerSettings, Stats,
                                       quote, rows_test, sql_literal)
# _Resolver (private to the planner) is also used by the engine's CER modules as planner.cer._Resolver
from matchrec.planner.cer.resolve import _Resolver, describe_source, has_rowid, resolve_query, to_sql, window_of

__all__ = ["CER_CHOICES", "FILTER_COVER", "MAX_COST", "MECHANISMS", "Model", "cost_model", "mechanism_support",
           "NO_WINDOW", "RATE_CHANGE", "SAMPLE_ROWS", "SAMPLE_TRIALS",
           "UNIT_SECONDS", "WINDOW_BEYOND_KEYS", "CerPlan", "CerSettings", "PyCompiler", "Stats", "anchor_cover",
           "anchors_of", "arithmetic_bounds", "choose_filtering", "choose_mechanism", "combine_bounds",
           "compile_conditions", "compile_projections", "describe_source", "estimate_conditions", "fits_int64",
           "gather_stats", "has_rowid", "int_bounds", "interval_cover", "partitioned_cover", "pattern_shape",
           "plan_query", "python_column", "quote", "rate_changes", "resolve_query", "rows_test", "sql_literal",
           "to_sql", "window_of"]
