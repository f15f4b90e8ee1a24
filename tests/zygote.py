"""A forking launcher for the trainer tests: one process imports torch and the trainer libraries
once, then every start of an example is a fork of it, not a new interpreter.

Why: an interrupted job is started once per interruption and once more to finish, and each start
of a fresh interpreter spends 3 s (torch) to 7 s (Lightning) importing before its first step; that
was most of the trainer tests' time in CI.

A start (``Zygote.spawn``) forks a *runner* that does what the local provider's ``RUNNER`` shell
does: it leads a new session (so a new process group), says its pid in ``HOME/pid``, keeps the
file descriptors it was handed (the instance's locked ``alive.lock``), outlives SIGTERM and
SIGINT, waits for the trainer and writes its exit status to ``HOME/exit_code`` (``128 + N`` when
signal N ended it). The runner forks the *trainer*, which runs ``python SCRIPT ARGS`` as a new
interpreter would: the script as ``__main__``, ``sys.argv``, ``sys.path[0]`` the script's folder,
the job's environment and working directory, default signal handlers, stdin from /dev/null,
stdout and stderr to the given file, and the interpreter's own exit (atexit handlers, non-daemon
threads, the status of ``SystemExit`` or of an uncaught exception). Both are real processes of
one group: the tests signal and kill them as they would any.

What differs from a new interpreter: the modules the zygote imported are imported (their
import-time reads of the environment saw the test process's; the scripts preloaded here read
none), and no torch operation has run before the fork, so no thread pool is copied. Every test
module that forks its runs compares them, bit for bit, with an uninterrupted run of the same
script in a new interpreter, so any difference the fork made would fail the tests.

Run as ``python tests/zygote.py FD PRELOAD...``: ``FD`` is this end of a ``SOCK_SEQPACKET``
socket pair; each ``PRELOAD`` is a script (``*.py``), executed once as a module not named
``__main__`` (its imports, its definitions), or a module to import (one a script imports only
when it runs: ``torch.use_deterministic_algorithms`` imports ``torch._inductor``, 1.5 s); then
``ready`` is sent and one request is served per message. The zygote exits when the test
process's end of the pair closes.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_MESSAGE = 1 << 20
READY_TIMEOUT_S = 120.0
"""Preloading torch, transformers and Lightning on a loaded 2-core machine: well under this."""


@dataclass(frozen=True)
class Zygote:
    """The test process's handle on a running zygote (``start``, then ``spawn`` per job start)."""

    process: subprocess.Popen[bytes]
    channel: socket.socket
    lock: threading.Lock

    @classmethod
    def start(cls, preload: Sequence[Path | str], output: Path) -> Zygote:
        """A zygote that has run the scripts (``Path``) and imported the modules (``str``) of
        ``preload``; its own output goes to ``output``."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs, output.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, __file__, str(theirs.fileno()), *map(str, preload)],
                env={k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
            )
        zygote = cls(process, mine, threading.Lock())
        mine.settimeout(READY_TIMEOUT_S)
        try:
            ready = mine.recv(16)
        except TimeoutError:
            ready = b""
        if ready != b"ready":
            zygote.stop()
            raise RuntimeError(f"the zygote did not start; its output:\n{output.read_text()}")
        mine.settimeout(None)
        return zygote

    def spawn(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | Path | None,
        home: Path,
        output: int,
        keep: Sequence[int] = (),
    ) -> int:
        """Start ``command`` (``python SCRIPT ARGS``, this interpreter) as a runner and its
        trainer; the runner's pid, which is also the process group's id. ``output`` becomes
        the trainer's stdout and stderr; the runner and the trainer keep ``keep`` open."""
        if len(command) < 2 or command[0] != sys.executable or not command[1].endswith(".py"):
            raise ValueError(f"the zygote runs 'python SCRIPT ARGS' only (with {sys.executable}): {command}")
        request = {
            "script": command[1],
            "args": list(command[2:]),
            "env": dict(env),
            "cwd": str(cwd) if cwd is not None else None,
            "home": str(home),
        }
        with self.lock:
            socket.send_fds(self.channel, [json.dumps(request).encode()], [output, *keep])
            reply = json.loads(self.channel.recv(MAX_MESSAGE))
        if "error" in reply:
            raise OSError(reply["error"])
        return int(reply["pid"])

    @contextlib.contextmanager
    def running(
        self, command: Sequence[str], *, env: Mapping[str, str], cwd: str | Path | None, home: Path
    ) -> Iterator[int]:
        """``spawn`` with the output to ``home/output``, as a context: the runner's pid inside; on
        leaving, the process group is killed unless the runner has recorded the trainer's status
        (a test that fails half-way leaves no process behind)."""
        with (home / "output").open("wb") as output:
            runner = self.spawn(command, env=env, cwd=cwd, home=home, output=output.fileno())
        try:
            yield runner
        finally:
            if not (home / "exit_code").exists():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(runner, signal.SIGKILL)

    def stop(self) -> None:
        """End the channel (the zygote exits on its end) and wait for it. Its runners are left
        to whoever launched them (the local provider's teardown ends every instance).

        Shut down, not only closed: the socket ends for the zygote only when every descriptor of
        it is closed, and a process started or forked elsewhere in this test process (an xdist
        worker runs other modules' tests) may hold a copy; ``shutdown`` ends it for all of them."""
        with contextlib.suppress(OSError):
            self.channel.shutdown(socket.SHUT_RDWR)
        self.channel.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def exit_code(home: Path, timeout_s: float) -> int:
    """The status the runner of ``home`` recorded for its trainer, once it has (the runner is the
    zygote's child, not the test's: its file is how the test learns the trainer ended)."""
    deadline = time.monotonic() + timeout_s
    while not (home / "exit_code").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no exit status in {home} after {timeout_s:g} s")
        time.sleep(0.02)
    return int((home / "exit_code").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Trainer:
    """What the trainer process runs, once it has left the zygote's code."""

    script: str
    args: list[str]
    env: dict[str, str]
    cwd: str | None

    def run(self) -> None:
        """Run the script as ``python SCRIPT ARGS`` does; its ``SystemExit`` or exception ends
        this interpreter as it would end that one."""
        if self.cwd is not None:
            os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        sys.argv = [self.script, *self.args]
        sys.path[0] = os.path.dirname(os.path.realpath(self.script))  # as the interpreter sets it
        runpy.run_path(self.script, run_name="__main__")


def serve(channel: socket.socket, preload: Sequence[str]) -> Trainer | None:
    """Preload, then fork a runner per request until the test process goes; returns only in a
    trainer (what it must run) or when the channel closes (None)."""
    own_path = sys.path[0]
    for item in preload:
        if item.endswith(".py"):
            sys.path[0] = os.path.dirname(os.path.abspath(item))
            runpy.run_path(item, run_name="__zygote_preload__")
        else:
            importlib.import_module(item)
    sys.path[0] = own_path
    # What is loaded now stays: the collector leaves it alone in every fork, so an exit takes
    # 0.1 s instead of the 0.7 s a new interpreter spends collecting torch's objects (and the
    # forks' pages stay shared). As the ``gc.freeze`` documentation advises for fork servers.
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runners are reaped by the kernel
    channel.send(b"ready")
    while True:
        message, fds, _flags, _address = socket.recv_fds(channel, MAX_MESSAGE, 16)
        if not message:
            return None
        request = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            channel.send(json.dumps({"error": f"fork: {exc}"}).encode())
        else:
            if pid == 0:
                channel.close()
                return _runner(request, fds)
            channel.send(json.dumps({"pid": pid}).encode())
        for fd in fds:
            os.close(fd)


def _runner(request: dict[str, object], fds: list[int]) -> Trainer:
    """In the forked runner: set up as ``RUNNER`` does, fork the trainer and return in it; the
    runner itself waits, records the trainer's status and exits with it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # RUNNER's `trap : TERM INT`: outlive, then record
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    home = Path(str(request["home"]))
    _write(home / "pid", os.getpid())
    output, *_kept = fds
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(stdin)
    os.close(output)
    pid = os.fork()
    if pid == 0:
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        env, cwd = request["env"], request["cwd"]
        assert isinstance(env, dict) and isinstance(request["args"], list)
        return Trainer(str(request["script"]), request["args"], env, str(cwd) if cwd else None)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code
    _write(home / "exit_code", code)
    os._exit(code)


def _write(path: Path, value: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{value}\n", encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    trainer = None
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C in pytest reaches the zygote too
        trainer = serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2:])
    if trainer is not None:
        trainer.run()
