"""The parent of a local job's command: records its exit status where any later process can read it.

The local provider starts ``python -m spotopt.providers.local_runner EXIT_FILE -- COMMAND…`` as
the leader of a new process group. A daemon that restarted is not the job's parent and cannot
``wait`` for it, so this small runner waits instead and writes the status to ``EXIT_FILE``
(atomically). It survives the group's SIGTERM (a no-op handler, which unlike ``SIG_IGN`` is not
inherited by the command) so it can record how the command answered it; SIGKILL ends both and
leaves no file, which the provider reports as killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m spotopt.providers.local_runner EXIT_FILE -- COMMAND…", file=sys.stderr)
        return 2
    exit_file, command = Path(argv[0]), argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _sig, _frame: None)
    try:
        code = subprocess.call(command)
    except OSError as exc:  # the program does not exist or is not executable: the shell's 127
        print(f"spotopt local runner: cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        code = 127
    tmp = exit_file.with_suffix(".tmp")
    tmp.write_text(str(code), encoding="utf-8")
    os.replace(tmp, exit_file)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
