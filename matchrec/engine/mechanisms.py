"""Which implementation evaluates the CER mechanisms: ``operators.cer_mechanisms``, with the reference
semantics behind the same interface for a mechanism whose module is not installed."""
from __future__ import annotations

import importlib.util

from matchrec.errors import OperationalError
from matchrec.operators.cer_reference import reference_matches
from matchrec.planner import cer as P


class _ReferenceMechanisms:
    """The mechanisms' interface over the reference semantics, used when the evaluation mechanisms
    are not installed: every name evaluates by brute force, so it suits small inputs only."""
    MECHANISMS = {name: None for name in P.MECHANISMS}
    label = "reference semantics (brute force; the evaluation mechanisms are not installed)"

    @staticmethod
    def supports(name: str, pattern) -> str:
        return "" if name in P.MECHANISMS else f"unknown mechanism {name}"

    @staticmethod
    def run(name, pattern, events, *, order=None, max_matches=None) -> list:
        out = reference_matches(pattern, events)
        if max_matches is not None and len(out) > max_matches:
            raise OperationalError(f"The pattern has more than {max_matches} matches; raise SET "
                                   f"matchrec_cer_max_matches, or RETURN COUNT(*) to count them without keeping them")
        return out

    @staticmethod
    def count(name, pattern, events, *, order=None, max_matches=None) -> int:
        return len(reference_matches(pattern, events))


class _Partial:
    """The evaluation mechanisms whose modules are installed, the reference semantics for the others."""

    def __init__(self, m, missing: set):
        self.m, self.missing = m, missing
        self.MECHANISMS = m.MECHANISMS
        self.label = (f"{getattr(m, 'label', 'evaluation mechanisms')}; "
                      f"{', '.join(sorted(missing))} by the reference semantics (not installed)")

    def _impl(self, name):
        return _ReferenceMechanisms if name in self.missing else self.m

    def supports(self, name, pattern) -> str:
        return self.m.supports(name, pattern)  # what the mechanism will accept, installed or not

    def run(self, name, pattern, events, **kw):
        return self._impl(name).run(name, pattern, events, **kw)

    def count(self, name, pattern, events, **kw):
        return self._impl(name).count(name, pattern, events, **kw)


def mechanisms():
    """The evaluation mechanisms (``operators.cer_mechanisms``); a mechanism whose module is not
    installed is evaluated by the reference semantics behind the same interface."""
    try:
        from matchrec.operators import cer_mechanisms as m
    except ImportError:
        return _ReferenceMechanisms
    if not all(hasattr(m, a) for a in ("run", "count", "supports", "MECHANISMS")):
        return _ReferenceMechanisms
    missing = set()
    for name, mech in m.MECHANISMS.items():
        module = getattr(mech, "module", None)
        if module is not None and importlib.util.find_spec(f"matchrec.operators.{module}") is None:
            missing.add(name)
    return _Partial(m, missing) if missing else m
