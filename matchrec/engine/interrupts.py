"""Ctrl-C during a DuckDB call: the running query is interrupted at once.

Python runs a signal handler only when the main thread returns to the interpreter, and DuckDB
polls for a pending signal only at some points of its execution: a Ctrl-C could wait minutes
for a long join. While a statement runs in the main thread, ``forwarding(duck)`` sets Python's
wakeup file descriptor (``signal.set_wakeup_fd``), which the C-level handler writes to as soon
as the signal arrives; a daemon thread reads it and calls ``duck.interrupt()``. DuckDB then
stops with its "interrupted" error, which the callers turn into KeyboardInterrupt, and the
pending signal raises KeyboardInterrupt in the main thread as before. The thread also stops the
statement's work budget (``budget.interrupt_main``), so a matcher stops at a poll of its budget
even when Python dropped its own KeyboardInterrupt on the way.

Any Python-level SIGINT handler is served this way (the default one, or the one a SparkContext in
the same process installs, which cancels its jobs and raises KeyboardInterrupt), and only when no
one else holds the wakeup descriptor (an asyncio loop, for one): then nothing changes.
"""
from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading

from matchrec import budget as work

_state = threading.Lock()
_reader: socket.socket | None = None
_writer: socket.socket | None = None
_target = None  # the DuckDB connection of the statement running in the main thread
_depth = 0


_serving = threading.RLock()  # held while a signal is served, and while a statement's end drains its signals


def _listen(reader: socket.socket) -> None:
    while True:
        try:
            select.select([reader], [], [])
        except (OSError, ValueError):
            return
        with _serving:
            try:
                data = reader.recv(512)
            except BlockingIOError:
                continue  # the statement it came in ended meanwhile and drained it (``_drain``)
            except (OSError, ValueError):
                return
            if not data:
                return
            if signal.SIGINT in data:
                work.interrupt_main()
                target = _target
                if target is not None:
                    try:
                        target.interrupt()
                    except Exception:  # noqa: BLE001 - a closed connection has nothing left to stop
                        pass


def _drain() -> None:
    """Drop the signals written for a statement that has ended: under load the thread may not have
    served them yet, and served late they would interrupt the connection's next statement."""
    while True:
        try:
            if not _reader.recv(512):
                return
        except (BlockingIOError, OSError, ValueError):
            return


def _start() -> None:
    global _reader, _writer
    if _reader is None:
        _reader, _writer = socket.socketpair()
        _writer.setblocking(False)
        _reader.setblocking(False)  # the thread waits in select; a statement's end drains it (``_drain``)
        threading.Thread(target=_listen, args=(_reader,), name="matchrec-interrupts", daemon=True).start()


@contextlib.contextmanager
def forwarding(duck):
    """Within the block, Ctrl-C in the main thread interrupts DuckDB's work on ``duck``."""
    global _target, _depth
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler):
        yield  # SIGINT ignored, or left to the C default, or not ours to serve from this thread
        return
    if _depth:  # a nested call of the same statement (executemany, run_many): already served
        _depth += 1
        previous_target, _target = _target, duck
        try:
            yield
        finally:
            _target = previous_target
            _depth -= 1
        return
    with _state:
        _start()
    try:
        # Python's view of the handler can be stale: a library may have replaced the C-level
        # handler behind its back (Arrow Flight's serve() does, and after several servers in one
        # process shut down, a dead server's handler stays installed and Ctrl-C does nothing).
        # Installing Python's handler again is one sigaction call.
        signal.signal(signal.SIGINT, handler)
        previous = signal.set_wakeup_fd(_writer.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        yield
        return
    if previous != -1:  # someone else listens for signals this way: leave it to them
        signal.set_wakeup_fd(previous)
        yield
        return
    _target, _depth = duck, 1
    work.clear_interrupt()
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)  # first: no signal written after the drain below
        with _serving:
            _drain()
            _target, _depth = None, 0
