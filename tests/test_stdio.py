"""``native_stdout_to_stderr``: what a C library prints on descriptor 1 during a solve goes to stderr."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import ctypes, os, sys
from spotopt.stdio import native_stdout_to_stderr
print("before", flush=True)
with native_stdout_to_stderr():
    ctypes.CDLL(None).printf(b"native printf, buffered by C stdio\\n")
    os.write(1, b"native write to fd 1\\n")
    with native_stdout_to_stderr():  # nested: restored once, by the outer block
        os.write(1, b"nested\\n")
    os.write(1, b"still inside\\n")
print("after")
"""


def test_native_output_inside_the_guard_goes_to_stderr_and_stdout_comes_back() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout == "before\nafter\n"
    for line in ("native printf, buffered by C stdio", "native write to fd 1", "nested", "still inside"):
        assert line in done.stderr
