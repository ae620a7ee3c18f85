"""Which implementation evaluates the CER mechanisms: ``operators.cer_mechanisms``, whose registry
imports every mechanism module as an ordinary module (so a missing one is an install error, not a
silent fallback to brute force)."""
from __future__ import annotations

from matchrec.operators import cer_mechanisms


def mechanisms():
    """The evaluation mechanisms (``operators.cer_mechanisms``)."""
    return cer_mechanisms
