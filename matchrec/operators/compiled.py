"""The compiled kernels' signatures; loading or compiling them, and the parser, before a query needs them.

numba compiles a kernel once per tuple of argument types and keeps the machine code in its
cache (``cache=True``): in ``__pycache__`` beside the module when that folder is writable, else
in numba's per-user cache folder, or under ``NUMBA_CACHE_DIR`` when that is set. A cached
kernel still costs the first call of a process its load (numba's CPU target, then the object
code), and an uncached one a compile of several seconds of CPU (``operators.vm.run_partitions``
is one large function with its helpers inlined).

``kernels()`` lists the argument types the engine passes: every array C-contiguous and
writable (a read-only array, e.g. one viewing an Arrow buffer, is another type to numba and
would compile again), ints as int64. run_partitions has six variants by design: ``conds``,
``pcode`` and ``state`` are None when a pattern has no register comparisons, DEFINE programs or
per-thread aggregates/FIRST rows, so numba prunes those branches from the hot loop.

``warm()`` builds the MATCH_RECOGNIZE parser (parser.body, from lark's cache when it can), then
loads (or compiles and caches) the kernels on a background thread, in the order queries
most often need them. A query that needs a kernel the thread is still building waits for it
(numba compiles under one process-wide lock and reuses what the lock's holder added), so it
never compiles the same kernel twice. Compiling is mostly Python holding the GIL: the thread
goes one kernel at a time and stops between kernels at interpreter exit.
"""
from __future__ import annotations

import atexit
import threading

# variants of run_partitions: (register comparisons, DEFINE programs, per-thread state: running
# aggregates and FIRST rows), in the order warm() builds them. The first two are the patterns with
# plain conditions (the demo's two queries); per-thread state comes only with DEFINE programs.
RUN_VARIANTS = ((False, False, False), (True, False, False), (False, True, False), (True, True, False),
                (False, True, True), (True, True, True))
PRIMARY = 2  # how many of RUN_VARIANTS warm() builds unless asked for all

_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()
_done: list[str] = []  # what the thread has loaded or compiled, in order


def run_partitions_signature(conds: bool, programs: bool, state: bool = False) -> tuple:
    """Argument types of operators.vm.run_partitions as engine.fast calls it."""
    from numba import types as t

    def a(dtype, ndim=1):
        return t.Array(dtype, ndim, "C")

    i64, i32, b, f64 = t.int64, t.int32, t.boolean, t.float64
    return (
        a(i32), a(i32), a(i32), a(b), i64, a(i64), a(i64),                        # op .. reg_init
        a(i64, 2) if state else t.none, b,                                         # state, compensated
        a(i64), a(i64), i64,                                                       # masks .. part_from
        a(i64, 2) if conds else t.none,                                            # conds
        a(i64, 2), a(b, 2), a(f64, 2), a(b, 2), a(i64), a(b), a(f64), a(b),        # ivals .. fnull_ok
        a(i64, 2) if programs else t.none,                                         # pcode
        a(i64, 2), a(i64),                                                         # pleaf, pfirst
        b, b, a(i64), a(i64), a(f64), a(f64), a(b), a(b), b,                       # has_within .. within_desc
        i64, i64, i64, b, i64, i64, i64,                                           # skip_kind .. first_mask
        a(i64), a(i64), a(i64), a(i64), a(i64), a(i64),                            # ev_*
        a(t.int16), a(i64), a(t.uint8),                                            # labels_out, exc_out, possible
        a(i32), a(i64), a(i64), a(i64), a(i64, 2),                                 # arena_*, vis_*
        a(i32), a(i64), a(i64, 2), a(i32), a(i64), a(i64, 2),                      # cur_*, nxt_*
        a(i64), a(i64), i64, i64,                                                  # stop, spent, worker, step_limit
    )


def label_extents_signature() -> tuple:
    """Argument types of operators.kernels.label_extents as engine.output calls it."""
    from numba import types as t
    return (t.Array(t.int16, 1, "C"), t.Array(t.int64, 1, "C"), t.Array(t.int64, 1, "C"), t.int64)


def kernels(full: bool = True) -> list[tuple[str, object, tuple]]:
    """(name, dispatcher, signature) of every kernel signature, in the order warm() builds them."""
    from matchrec.operators import kernels as K
    from matchrec.operators import vm
    out = [("label_extents", K.label_extents, label_extents_signature())]
    for conds, programs, state in RUN_VARIANTS if full else RUN_VARIANTS[:PRIMARY]:
        name = ("run_partitions" + ("+conds" if conds else "") + ("+programs" if programs else "")
                + ("+state" if state else ""))
        out.append((name, vm.run_partitions, run_partitions_signature(conds, programs, state)))
    return out


def _build(full: bool) -> None:
    try:
        from matchrec.parser.body import _parser
        _parser()  # the MATCH_RECOGNIZE grammar's tables (lark), from their cache when it has them
        _done.append("parser")
        for name, dispatcher, sig in kernels(full):
            if _stop.is_set():
                return
            dispatcher.compile(sig)  # loads from the cache when it can, else compiles and saves
            _done.append(name)
    except Exception:  # noqa: BLE001 - warming is an optimisation: the query compiles what it needs itself
        pass


def _at_exit() -> None:
    _stop.set()
    thread = _thread
    if thread is not None:
        thread.join()  # never let the interpreter finalise under a thread inside LLVM


def warm(wait: bool = False, full: bool = False) -> threading.Thread:
    """Load or compile the compiled matcher's kernels on a background thread (once per process).

    ``full``: all six run_partitions variants instead of the two without DEFINE programs.
    ``wait``: block until the thread is done. Returns the thread."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_build, args=(full,), name="matchrec-warm", daemon=True)
            atexit.register(_at_exit)
            _thread.start()
        thread = _thread
    if wait:
        thread.join()
    return thread


def precompile() -> None:
    """Compile every kernel signature into numba's cache now, in this thread (the editable
    install's build step; see buildtools/matchrec_build.py). A signature already cached is loaded."""
    for _name, dispatcher, sig in kernels(full=True):
        dispatcher.compile(sig)


def built() -> list[str]:
    """Names of the kernel signatures the warm-up thread has loaded or compiled so far."""
    return list(_done)
