"""Session settings: what ``SET`` and ``RESET`` may change, and the checks of their values.

A session holds two groups: the MATCH_RECOGNIZE engine's (``engine.executor.Settings``, named
``matchrec_<field>``, plus ``pull_strategy`` for storage nodes) and the CER statements'
(``planner.cer.CerSettings``, named ``matchrec_cer_<field>``). ``apply`` changes one of them
from the name and raw value the statement classifier found; bad names and values are
ProgrammingErrors naming what is allowed.
"""
from __future__ import annotations

from dataclasses import fields

from matchrec import errors as E
from matchrec.engine.executor import Settings
from matchrec.planner.cer import CER_CHOICES, CerSettings

SETTINGS = {f"matchrec_{f.name}": f.name for f in fields(Settings)}
SETTINGS["pull_strategy"] = "pull_strategy"  # the name storage-node users know from the literature
CHOICES = {"pull_strategy": ("auto", "pull_all", "push_down", "naive_dfs", "dfs", "dfs_stateful", "push_pull"),
           "round_trips": ("auto", "always", "never")}
SETTING_MAX = (1 << 63) - 1  # settings reach the compiled matcher as 64-bit integers
_ZERO_ALLOWED = ("fast_path", "prefilter", "node_retries", "node_retry_backoff_ms")
_CER_PREFIX = "matchrec_cer_"


def integer_setting(name: str, raw: str, minimum: int) -> int:
    """The value of ``SET name = raw`` for an integer setting (digits may be grouped by _)."""
    try:
        value = int(raw.replace("_", ""))
        if not minimum <= value <= SETTING_MAX:
            raise ValueError
    except ValueError:
        raise E.ProgrammingError(f"SET {name} needs an integer >= {minimum} (and at most {SETTING_MAX:,}), "
                                 f"got {raw!r}") from None
    return value


def apply(settings: Settings, cer_settings: CerSettings, name: str, raw: str | None, reset: bool) -> None:
    """``SET name = raw`` (or ``RESET name`` when ``reset``) on a session's two setting groups."""
    name = name.lower()
    if name.startswith(_CER_PREFIX):
        _apply_cer(cer_settings, name, raw, reset)
        return
    if name not in SETTINGS:
        raise E.ProgrammingError(f"Unknown setting {name}; known: {', '.join(sorted(SETTINGS))}")
    attr = SETTINGS[name]
    if reset:
        setattr(settings, attr, getattr(Settings(), attr))
        return
    raw = _unquoted(raw)
    if attr in CHOICES:
        if raw.lower() not in CHOICES[attr]:
            raise E.ProgrammingError(f"SET {name} takes one of {', '.join(CHOICES[attr])}, got {raw!r}")
        setattr(settings, attr, raw.lower())
        return
    setattr(settings, attr, integer_setting(name, raw, 0 if attr in _ZERO_ALLOWED else 1))


def _apply_cer(settings: CerSettings, name: str, raw: str | None, reset: bool) -> None:
    attr = name[len(_CER_PREFIX):]
    known = [f.name for f in fields(CerSettings) if f.metadata.get("settable", True)]
    if attr not in known:
        raise E.ProgrammingError(f"Unknown setting {name}; known: {', '.join(_CER_PREFIX + k for k in known)}")
    if reset:
        setattr(settings, attr, getattr(CerSettings(), attr))
        return
    raw = _unquoted(raw)
    if attr in CER_CHOICES:
        if raw.lower() not in CER_CHOICES[attr]:
            raise E.ProgrammingError(f"SET {name} takes one of {', '.join(CER_CHOICES[attr])}, got {raw!r}")
        setattr(settings, attr, raw.lower())
    elif attr in ("max_matches", "max_partial_matches"):
        setattr(settings, attr, integer_setting(name, raw, 1))
    else:
        if not raw:
            raise E.ProgrammingError(f"SET {name} needs a column name")
        setattr(settings, attr, raw)


def _unquoted(raw: str | None) -> str:
    return (raw or "").strip().strip("'\"")
