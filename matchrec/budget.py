"""The work budget of a running statement: matcher steps, memory growth and interruption.

A statement that matches patterns runs under one ``Budget``. Its matchers poll it:

* the reference matcher charges its steps (a thread taking a row, plus the rows of match
  history a condition reads) with ``spend``;
* the compiled matcher's kernels share ``stop`` (a one-element array) and count their steps in
  an array of their own; they return a status the Python side turns into the error;
* every other Python loop (the CER mechanisms, output) is stopped by the watcher thread, which
  samples the process's resident memory every few milliseconds and, once it has grown by more
  than the limit since the statement started, sets ``stop`` and raises ``BudgetExceeded`` in the
  statement's thread.

``BudgetExceeded`` derives from BaseException so that no ``except Exception`` on its way can
mistake it for an engine failure; leaving the ``with`` block turns it into an OperationalError
naming the setting. Ctrl-C stays a KeyboardInterrupt: it reaches Python loops directly, and the
compiled matcher's waiting thread passes it on to the kernels through ``stop``.

Python raises the KeyboardInterrupt of a Ctrl-C in whatever the main thread runs at that moment;
when that is a ``__del__`` method or a garbage-collection callback, Python prints "Exception
ignored" and the statement runs on (seen: a reference match over 100,000 rows that ran past
ten minutes). So the signal is also recorded here (``interrupt_main``, called by the thread
that serves Python's wakeup descriptor, see ``engine/interrupts.py``) on the budget of the
statement running in the main thread. Python's own KeyboardInterrupt normally arrives within
microseconds; only when the statement still polls its budget ``LOST_INTERRUPT_SECONDS`` later was
it dropped, and the poll raises it then (raising it at once would deliver one Ctrl-C twice).
"""
from __future__ import annotations

import _thread
import ctypes
import os
import resource
import sys
import threading
import time

import numpy as np

from matchrec.errors import OperationalError

RUNNING, INTERRUPTED, OUT_OF_MEMORY, OUT_OF_STEPS = range(4)
WATCH_SECONDS = 0.005  # how often the watcher samples memory
# a step of the reference matcher (Python) costs about as much as this many compiled steps
REFERENCE_STEP_COST = 100
# an event bound (or a partial match extended) by a CER mechanism in Python
PYTHON_STEP_COST = 100
LOST_INTERRUPT_SECONDS = 0.5  # after a Ctrl-C, when Python's own KeyboardInterrupt counts as dropped

_page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_local = threading.local()
# the budget of the statement running in the main thread, and whether Ctrl-C arrived during it
_main: dict = {"budget": None, "interrupted": False}


def clear_interrupt() -> None:
    """A new statement starts in the main thread: an earlier Ctrl-C is no longer pending."""
    _main["interrupted"] = False


def interrupt_main() -> None:
    """Ctrl-C arrived: if Python drops its KeyboardInterrupt, the main thread's statement raises
    it at a poll of its budget a moment later."""
    _main["interrupted"] = True
    budget = _main["budget"]
    if budget is not None and not budget.interrupted_at:
        budget.interrupted_at = time.monotonic()


class BudgetExceeded(BaseException):
    """Raised into the statement's thread by the watcher (see the module docstring)."""


def resident_bytes() -> int:
    """The process's resident memory now (its peak where the current size cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _page
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def steps_error(limit: int) -> OperationalError:
    return OperationalError(f"Pattern matching used more than {limit:,} steps (a step: one partial match taking one "
                            f"row); the pattern may explode on this input. Simplify the pattern, add PARTITION BY "
                            f"or WITHIN, or raise the limit with SET matchrec_max_steps = <n>")


def memory_error(limit_mb: int) -> OperationalError:
    return OperationalError(f"The statement needed more than {limit_mb:,} MB of memory while matching; the pattern "
                            f"may have too many (partial) matches. Simplify the pattern, count the matches instead "
                            f"of returning them, or raise the limit with SET matchrec_max_memory_mb = <n>")


class Budget:
    """Steps, memory and interruption of one statement; a context manager around the work."""

    def __init__(self, max_steps: int, max_memory_mb: int):
        self.max_steps = max_steps
        self.max_memory_mb = max_memory_mb
        self.stop = np.zeros(1, np.int64)  # RUNNING or the reason to stop; read by compiled kernels
        self.steps = 0
        self._owner: int | None = None
        self._base = 0
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._fired = False
        self._outer: Budget | None = None
        self._outer_main: Budget | None = None
        self.interrupted_at = 0.0  # when a Ctrl-C arrived during the statement (0: none)

    # ------------------------------------------------------------------ polled by the matchers
    def spend(self, steps: int) -> None:
        self.steps += steps
        if self.steps > self.max_steps:
            self.stop[0] = OUT_OF_STEPS
            raise steps_error(self.max_steps)
        if self.stop[0] != RUNNING:
            raise self.error()
        if self.interrupted_at:
            self.check_interrupt()

    def check_interrupt(self) -> None:
        """Raise the KeyboardInterrupt of a Ctrl-C that Python dropped (see the module docstring)."""
        if self.interrupted_at and time.monotonic() - self.interrupted_at > LOST_INTERRUPT_SECONDS:
            self.interrupted_at = 0.0
            self.halt(INTERRUPTED)
            raise KeyboardInterrupt()

    def halt(self, reason: int) -> None:
        """Ask every kernel of the statement to stop (the first reason given is kept)."""
        if self.stop[0] == RUNNING:
            self.stop[0] = reason

    def error(self, reason: int | None = None) -> BaseException:
        """The exception for a stop ``reason`` (by default the recorded one)."""
        reason = int(self.stop[0]) if reason is None else reason
        if reason == OUT_OF_MEMORY:
            return memory_error(self.max_memory_mb)
        if reason == OUT_OF_STEPS:
            return steps_error(self.max_steps)
        return KeyboardInterrupt()

    # ------------------------------------------------------------------ the statement's extent
    def __enter__(self) -> "Budget":
        self._outer = getattr(_local, "budget", None)
        _local.budget = self
        self._owner = threading.get_ident()
        if threading.current_thread() is threading.main_thread():
            self._outer_main = _main["budget"]
            _main["budget"] = self
            if _main["interrupted"]:
                self.interrupted_at = time.monotonic()
        self._base = resident_bytes()
        # not threading.Thread, whose start() waits for the new thread to run: a hand-off of
        # milliseconds per statement on a busy machine. It is not joined either: it fires only
        # under the lock while the statement runs (see _watch), and ends by itself.
        _thread.start_new_thread(self._watch, ())
        return self

    def __exit__(self, kind, value, tb) -> bool:
        with self._lock:
            self._done.set()
            if self._fired:  # a BudgetExceeded may still be pending for this thread: cancel it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._owner), None)
        _local.budget = self._outer
        if _main["budget"] is self:
            _main["budget"] = self._outer_main
        if kind is BudgetExceeded or (self._fired and kind is None):
            raise self.error() from None
        return False

    def _watch(self) -> None:
        limit = self.max_memory_mb << 20
        while not self._done.wait(WATCH_SECONDS):
            if resident_bytes() - self._base <= limit:
                continue
            with self._lock:
                if self._done.is_set():
                    return
                self.halt(OUT_OF_MEMORY)
                self._fired = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._owner),
                                                           ctypes.py_object(BudgetExceeded))
            return


class _Unlimited(Budget):
    """The budget of work run outside any statement (direct calls of the operators)."""

    def __init__(self):
        super().__init__(1 << 62, 1 << 40)

    def spend(self, steps: int) -> None:
        pass


def current() -> Budget:
    """The budget of the statement running in this thread (unlimited when there is none)."""
    budget = getattr(_local, "budget", None)
    return budget if budget is not None else _Unlimited()


def active() -> bool:
    return getattr(_local, "budget", None) is not None


DEFAULT_MAX_STEPS = 300_000_000
DEFAULT_MAX_MEMORY_MB = 2048


def statement(settings=None, statements: int = 1):
    """A context for one statement's work: a new Budget from ``settings`` (``max_steps``,
    ``max_memory_mb``; the defaults without them), or nothing new inside a running one. Several
    ``statements`` evaluated together (a ``run_many`` group) get the steps of as many statements,
    so a workload fails only where its statements would together; memory is held at once, so
    its bound stays one statement's."""
    if active():
        return _Nested()
    return Budget(getattr(settings, "max_steps", DEFAULT_MAX_STEPS) * max(1, int(statements)),
                  getattr(settings, "max_memory_mb", DEFAULT_MAX_MEMORY_MB))


class _Nested:
    def __enter__(self) -> Budget:
        return current()

    def __exit__(self, *exc) -> bool:
        return False
