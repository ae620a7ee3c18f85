"""The reference semantics of CER patterns on hand-checked streams (cer_reference's rules)."""
import numpy as np

from matchrec.operators.cer_reference import (And, Condition, Element, Events, Or, Pattern, Seq,
                                              alternatives, reference_matches)

A, B = Element("a", "x"), Element("b", "y")
EV = Events(np.array([1, 2, 3, 4, 5, 6]), list("abxabb"))


def run(root, strategy="any", window=10, **kw):
    return [dict(m) for m in reference_matches(Pattern(root, window, strategy, **kw), EV)]


def test_strategies_on_a_sequence():
    assert run(Seq((A, B)), "strict") == [{"x": 0, "y": 1}, {"x": 3, "y": 4}]
    assert run(Seq((A, B)), "next") == [{"x": 0, "y": 1}, {"x": 3, "y": 4}]
    assert len(run(Seq((A, B)), "any")) == 5  # (0,1) (0,4) (0,5) (3,4) (3,5)


def test_window_is_inclusive():
    assert {"x": 0, "y": 4} in run(Seq((A, B)), window=4)
    assert {"x": 0, "y": 4} not in run(Seq((A, B)), window=3)


def test_kleene_under_next_grows_one_event_at_a_time():
    got = run(Seq((A, Element("b", "y", kleene=(1, None)))), "next")
    assert {"x": 0, "y": (1, 4, 5)} in got and {"x": 0, "y": (4,)} not in got  # b@1 may not be skipped
    assert run(Seq((A, Element("b", "y", kleene=(2, 2)))), "strict") == [{"x": 3, "y": (4, 5)}]


def test_negation_between_and_at_the_end():
    neg = Element("x", "n", negated=True)
    assert {"x": 0, "y": 4} not in run(Seq((A, neg, B)))  # the x at key 3 lies between
    assert {"x": 3, "y": 4} in run(Seq((A, neg, B)))
    # trailing negation looks at (last, first + W]
    assert run(Seq((Element("x", "z"), Element("b", "n", negated=True))), window=1) == [{"z": 2}]
    assert run(Seq((Element("x", "z"), Element("a", "n", negated=True))), window=1) == []


def test_and_or_and_conditions():
    assert alternatives(And((A, B))) == [(A, B), (B, A)]
    got = run(And((A, Element("x", "z"))))
    assert got == [{"x": 0, "z": 2}, {"x": 3, "z": 2}]
    assert len(run(Or((A, B)))) == 5  # each a and each b alone
    later = Condition(frozenset({"x", "y"}), lambda b: b["y"] - b["x"] >= 3)
    assert run(Seq((A, B)), conditions=[later]) == [{"x": 0, "y": 4}, {"x": 0, "y": 5}]


def test_equal_keys_are_never_in_sequence():
    ev = Events(np.array([1, 1, 2]), list("abb"))
    got = [dict(m) for m in reference_matches(Pattern(Seq((A, B)), 5, "any"), ev)]
    assert got == [{"x": 0, "y": 2}]
