"""Keep native libraries' prints off the user's stdout, which carries ``--format json|csv`` output.

A solver written in C or C++ writes to file descriptor 1 directly, so Python's ``sys.stdout``
(and typer's ``CliRunner``) never sees it: highspy prints ``Running HiGHS … Copyright`` there
even with ``output_flag`` and ``log_to_console`` off (HiGHS issue #2749, open in 2026; cvxpy
PR #2714 moved its own ``passOptions`` first for the same banner). Logging is switched off where
a library allows it, and ``native_stdout_to_stderr`` guards descriptor 1 around every native
solve in case a library still prints: whatever it writes goes to stderr, where a person still
sees it and a parser of stdout never does. A banner no option can stop (HiGHS's) is discarded
(``native_stdout_discarded``): on stderr it ran into the progress line of every command.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.RLock()
_LIBC = ctypes.CDLL(None)


def _flush_all() -> None:
    """Flush Python's stdout and every C stdio stream, so nothing buffered before or during the
    guard lands on the wrong descriptor after it (C ``stdout`` is fully buffered on a pipe)."""
    sys.stdout.flush()
    _LIBC.fflush(None)


@contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at descriptor 2 for the duration of the block.

    The redirection is process-wide: another thread's stdout written meanwhile goes to stderr
    too (never the other way), which is why the guard covers only the native call. Nested and
    concurrent uses are serialised by a re-entrant lock, so each block restores the descriptor
    it found.
    """
    with _native_stdout_to(2):
        yield


@contextmanager
def native_stdout_discarded() -> Iterator[None]:
    """Point file descriptor 1 at ``os.devnull`` for the block: for a banner printed where no
    option can stop it (HiGHS prints its own from the ``Highs`` constructor, before any option
    applies), which would otherwise run into the progress line on stderr. Keep the block to that
    one call: anything else written to descriptor 1 meanwhile is lost."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        with _native_stdout_to(null):
            yield
    finally:
        os.close(null)


@contextmanager
def _native_stdout_to(fd: int) -> Iterator[None]:
    with _LOCK:
        _flush_all()
        saved = os.dup(1)
        try:
            os.dup2(fd, 1)
            yield
        finally:
            _flush_all()
            os.dup2(saved, 1)
            os.close(saved)
