"""The agent inside a training job: when to checkpoint, when to stop, and talking to the store.

All state changes happen under one lock: the training loop (main thread), the SIGTERM handler
(also the main thread, hence a re-entrant lock) and the background poller thread share it.
The background thread exists only for managed jobs (``SPOTOPT_JOB`` set); it polls the lease,
the cloud's notice endpoint and the daemon's control requests every ``poll_s`` and writes a
heartbeat every ``heartbeat_s``. Nothing it does blocks the training loop.

Time comes from one injectable ``clock`` (seconds since the epoch, like ``time.time``), so a
simulated clock can drive the periodic trigger, steps/s and every timestamp.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from spotopt.agent.config import AgentConfig
from spotopt.agent.notices import poller_for
from spotopt.agent.steady import steady_rate
from spotopt.checkpoints.control import ControlRequest, RequestKind, acknowledge, pending_requests
from spotopt.checkpoints.heartbeat import AgentState, Heartbeat, mark_finished, write_heartbeat
from spotopt.checkpoints.lease import check_epoch, read_lease
from spotopt.checkpoints.location import Location
from spotopt.checkpoints.manifest import Manifest
from spotopt.checkpoints.store import restore_latest, write_checkpoint
from spotopt.clouds.common.notices import Notice, NoticeKind, NoticePoller
from spotopt.errors import InputError, SupersededError
from spotopt.young_daly import young_daly_s

Clock = Callable[[], float]
POLL_WARN_EVERY_S = 60.0
"""A failing notice poll or store write is said at most this often (it fails every round while
it fails)."""
STORE_RETRY_FIRST_S = 1.0
STORE_RETRY_MAX_S = 60.0
"""After the store refused a checkpoint (or its acknowledgement), the training loop's next try
waits ``STORE_RETRY_FIRST_S``, doubling per refusal up to this: an outage is not hammered, and
training goes on meanwhile."""
EXIT_STOPPED = 0
"""Exit status after a requested stop: the newest verified checkpoint holds all progress."""
EXIT_SUPERSEDED = SupersededError.exit_code
EXIT_UNSAVED = 75
"""Exit status (``EX_TEMPFAIL``) of a run that finished while the store refused its last
checkpoint: the result is not safe, so the job is not marked complete; the daemon's retry
resumes from the newest verified checkpoint and trains the rest again."""


def _stderr(message: str) -> None:
    print(f"spotopt agent: {message}", file=sys.stderr, flush=True)


class Agent:
    """One per process (see ``spotopt.agent``); tests build their own with a config and a clock."""

    def __init__(
        self,
        config: AgentConfig,
        clock: Clock = time.time,
        warn: Callable[[str], None] = _stderr,
        poller: NoticePoller | None = None,
        background: bool = True,
    ) -> None:
        """``background=False``: no poller thread; the caller drives ``poll_once`` (tests, simulations)."""
        self.config = config
        self.clock = clock
        self._warn = warn
        self._poller = poller
        self._background = background
        self._lock = threading.RLock()
        self._loc: Location | None = None
        self._scratch: Path | None = None
        self._resumed = False
        self._step = 0
        self._origin = 0
        """The step this process started from (the restored checkpoint's): warm-up counts from it."""
        self._last: Manifest | None = None
        self._last_checkpoint_at = clock()
        self._measured_checkpoint_s: float | None = None
        self._triggers: dict[str, ControlRequest | None] = {}
        self._seen: set[str] = set()
        self._stop_reason: str | None = None
        self._superseded: str | None = None
        self._beat: tuple[float, int] | None = None
        self._warned_at: dict[str, float] = {}
        self._refusals = 0
        self._retry_store_at: float | None = None
        self._unsaved: str | None = None
        """Why the newest checkpoint the script wrote is not in the store (None: it is)."""
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the training script's calls ---------------------------------------------------------

    def resume(self) -> Path | None:
        """The local directory holding the newest verified checkpoint, or None to start fresh."""
        loc = self._start()
        with self._lock:
            if not self._resumed:
                dest = self._scratch_dir() / "restored"
                self._last = restore_latest(
                    loc, self.config.job, read_lease(loc, self.config.job), dest, self._warn
                )
                self._step = self._origin = self._last.step if self._last else 0
                self._resumed = True
                if self._last is not None:
                    self._warn(
                        f"resuming job {self.config.job} from {self._last.name} (step {self._last.step})"
                    )
            return self._scratch_dir() / "restored" if self._last is not None else None

    def start_step(self) -> int:
        """The step the restored checkpoint reached (0 without one); resumes first if needed."""
        self.resume()
        return self._last_step()

    def progress(self, step: int) -> None:
        """Record that ``step`` steps are done. Cheap: the heartbeat thread reports it."""
        self._step = step

    def should_checkpoint(self) -> bool:
        """True when a checkpoint is due: the period elapsed, or the daemon, SIGTERM or a notice
        asked (not while waiting to try a store that refused the last one again)."""
        with self._lock:
            if self._superseded or self._store_backing_off():
                return False
            if self._step <= self._last_step():
                self._settle()
                return False
            if self._triggers:
                return True
            return self.clock() - self._last_checkpoint_at >= self.period_s()

    @contextmanager
    def checkpoint(self, step: int) -> Iterator[Path]:
        """A fresh local directory to write the state of ``step`` into; uploaded and verified on exit.

        On a clean exit of the ``with`` block the files are uploaded, read back and checked, the
        manifest is written last, and only then does the checkpoint count. If the block raises,
        nothing is uploaded. A superseded epoch exits the process (status 5) writing nothing.
        A store that refuses the checkpoint (an outage, a permission taken away) is said and
        training goes on: the newest verified checkpoint stays the one to resume from, and the
        checkpoint is tried again after a backoff (``STORE_RETRY_FIRST_S``), the requests it was
        to answer still pending.
        """
        loc = self._start()
        if self._superseded:
            self._exit_superseded()
        staging = self._scratch_dir() / f"staging-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        started = self.clock()
        with self._lock:
            answering = dict(self._triggers)
        try:
            yield staging
            now = self._now()
            try:
                manifest = write_checkpoint(
                    loc,
                    self.config.job,
                    step,
                    self.config.epoch,
                    staging,
                    now,
                    self.config.keep,
                    self.config.database,
                )
            except SupersededError as exc:
                self._supersede(str(exc))
                self._exit_superseded()
            except InputError:
                raise  # the script's mistake (nothing written into the directory), not the store's
            except Exception as exc:  # any back-end's refusal: permission, quota, outage, read-back
                with self._lock:
                    last = self._last
                    self._unsaved = f"checkpoint at step {step} not saved ({type(exc).__name__}: {exc})"
                    where = f"{last.name} (step {last.step})" if last else "none"
                    self._store_refused(f"{self._unsaved}; newest verified checkpoint: {where}")
                return
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        with self._lock:
            self._last = manifest
            self._last_checkpoint_at = self.clock()
            self._measured_checkpoint_s = self._last_checkpoint_at - started
            self._unsaved = None
            self._refusals, self._retry_store_at = 0, None
            self._answer(answering, manifest)
        if self.config.managed:
            self._heartbeat(AgentState.STOPPING if self._stop_reason else AgentState.RUNNING)

    def should_stop(self) -> bool:
        """True once a stop was asked for, the progress is safe in a verified checkpoint and the
        daemon's request acknowledged."""
        with self._lock:
            if self._superseded:
                return True
            return self._stop_reason is not None and not self._store_backing_off() and self._settle()

    def finish(self) -> None:
        """Mark the job complete with the newest verified checkpoint as its result.

        After a requested stop it instead exits the process (status 0) so that nothing after the
        loop runs as if training were complete; a superseded epoch exits with status 5.
        """
        loc = self._start()
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
        if self._superseded:
            self._exit_superseded()
        last = self._last
        if self._stop_reason is not None:
            if self.config.managed:
                self._heartbeat(AgentState.STOPPED)
            where = f"{last.name} (step {last.step})" if last else "none"
            self._warn(
                f"stopped at step {self._step} ({self._stop_reason}); newest verified checkpoint: {where}"
            )
            raise SystemExit(EXIT_STOPPED)
        if self._unsaved is not None and self._step > self._last_step():
            self._warn(
                f"finished at step {self._step}, but the {self._unsaved}: not marked complete; "
                "a retry resumes from the newest verified checkpoint"
            )
            raise SystemExit(EXIT_UNSAVED)
        if last is None or last.step < self._step:
            self._warn(
                f"finished at step {self._step} but the newest verified checkpoint is at step "
                f"{last.step if last else 0}: checkpoint on the last step to keep the result"
            )
        try:
            if self.config.managed:
                check_epoch(loc, self.config.job, self.config.epoch, self.config.database)
        except SupersededError as exc:
            self._supersede(str(exc))
            self._exit_superseded()
        now = self._now()
        mark_finished(loc, self.config.job, self.config.epoch, last.name if last else None, self._step, now)
        if self.config.managed:
            self._heartbeat(AgentState.FINISHED)

    # -- state the daemon and tests read -------------------------------------------------------

    def period_s(self) -> float:
        """The periodic checkpoint interval: ``SPOTOPT_CHECKPOINT_EVERY``, else Young/Daly.

        Young/Daly uses the measured duration of the last checkpoint once there is one (the
        write time of *this* job on *this* store), else ``SPOTOPT_CHECKPOINT_S``.
        """
        if self.config.checkpoint_every_s is not None:
            return self.config.checkpoint_every_s
        c = (
            self._measured_checkpoint_s
            if self._measured_checkpoint_s is not None
            else self.config.checkpoint_s
        )
        return young_daly_s(c, self.config.preemptions_per_hour)

    @property
    def last_checkpoint(self) -> Manifest | None:
        return self._last

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def request_stop(self, reason: str, request: ControlRequest | None = None) -> None:
        """Checkpoint at the next step boundary, then stop (SIGTERM, a preemption notice, the daemon)."""
        with self._lock:
            self._triggers[reason] = request
            if self._stop_reason is None:
                self._stop_reason = reason

    def request_checkpoint(self, reason: str, request: ControlRequest | None = None) -> None:
        """Checkpoint at the next step boundary and keep training."""
        with self._lock:
            self._triggers[reason] = request

    def poll_once(self) -> None:
        """One round of the background thread: lease, notice, control requests, maybe a heartbeat."""
        loc = self._start()
        job, epoch = self.config.job, self.config.epoch
        try:
            check_epoch(loc, job, epoch, self.config.database)
        except SupersededError as exc:
            self._supersede(str(exc))
            return
        if self._poller is not None:
            notice = self._poll_notice()
            if notice is not None and f"notice:{notice.kind}" not in self._seen:
                self._seen.add(f"notice:{notice.kind}")
                reason = f"{notice.cloud} {notice.kind} notice: {notice.detail}"
                self._warn(reason)
                if notice.kind is NoticeKind.PREEMPT:
                    self.request_stop(reason)
                else:
                    self.request_checkpoint(reason)
        for request in pending_requests(loc, job, epoch):
            if request.id not in self._seen:
                self._seen.add(request.id)
                reason = f"daemon request {request.id} ({request.kind})"
                if request.kind is RequestKind.CHECKPOINT_AND_STOP:
                    self.request_stop(reason, request)
                else:
                    self.request_checkpoint(reason, request)
        if self._beat is None or self.clock() - self._beat[0] >= self.config.heartbeat_s:
            self._heartbeat(AgentState.STOPPING if self._stop_reason else AgentState.RUNNING)

    # -- internals ------------------------------------------------------------------------------

    def _poll_notice(self) -> Notice | None:
        """The cloud's notice, or None; a poll that fails (a metadata service that refuses, times
        out or does not resolve) is said at most once per ``POLL_WARN_EVERY_S`` and counts as no
        notice, so the round's lease check, control requests and heartbeat still run: without
        them the daemon would take the agent for dead and its stop request would go unread."""
        assert self._poller is not None
        try:
            return self._poller.poll()
        except Exception as exc:
            self._warn_now_and_then(
                "poll", f"notice poll failed ({type(exc).__name__}: {exc}); the round goes on"
            )
            return None

    def _warn_now_and_then(self, what: str, message: str) -> None:
        """Say ``message`` unless a message about ``what`` was said within ``POLL_WARN_EVERY_S``."""
        now = self.clock()
        said = self._warned_at.get(what)
        if said is None or now - said >= POLL_WARN_EVERY_S:
            self._warned_at[what] = now
            self._warn(message)

    def _store_refused(self, message: str) -> None:
        """The store refused the training loop's write: say so, and wait before the next try."""
        self._refusals += 1
        wait = min(STORE_RETRY_MAX_S, STORE_RETRY_FIRST_S * 2 ** (self._refusals - 1))
        self._retry_store_at = self.clock() + wait
        self._warn(f"{message}; training goes on, trying the store again in {wait:g} s")

    def _store_backing_off(self) -> bool:
        return self._retry_store_at is not None and self.clock() < self._retry_store_at

    def _start(self) -> Location:
        """Open the store on first use: lease check, write probe, SIGTERM handler, poller thread."""
        with self._lock:
            if self._loc is not None:
                return self._loc
            loc = Location(self.config.checkpoint_uri, self.config.storage_options)
            if self.config.managed:
                self._await_lease(loc)
                try:
                    check_epoch(loc, self.config.job, self.config.epoch, self.config.database)
                except SupersededError as exc:
                    self._supersede(str(exc))
                    self._exit_superseded()
            loc.check_writable()
            self._loc = loc
            main = threading.current_thread() is threading.main_thread()
            if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, lambda _sig, _frame: self.request_stop("SIGTERM"))
            if self.config.managed:
                if self._poller is None:
                    self._poller = poller_for(self.config)
                if self._background:
                    self._thread = threading.Thread(target=self._run, name="spotopt-agent", daemon=True)
                    self._thread.start()
            return loc

    def _await_lease(self, loc: Location) -> None:
        """Wait while the lease is older than our epoch: the daemon launched us ahead of a move
        (make-before-break) and grants us the lease once the old placement's checkpoint is
        verified. A ``waiting`` heartbeat tells the daemon we are up; nothing is restored or
        written meanwhile, so the old placement keeps training undisturbed."""
        job, epoch = self.config.job, self.config.epoch
        announced = False
        while (lease := read_lease(loc, job)) is not None and lease.epoch < epoch:
            if not announced:
                self._warn(f"job {job}: epoch {epoch} waits for the lease (held by epoch {lease.epoch})")
                announced = True
            try:
                write_heartbeat(
                    loc,
                    Heartbeat(job, epoch, AgentState.WAITING, 0, None, None, None, self._now()),
                )
            except Exception as exc:  # the store refuses for now: the daemon waits; so do we
                self._warn_now_and_then("heartbeat", f"heartbeat not written ({type(exc).__name__}: {exc})")
            if self._halt.wait(self.config.poll_s):
                return

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def _run(self) -> None:
        while not self._superseded:
            try:
                self.poll_once()
            except Exception as exc:  # a flaky network must not kill training; say so and retry
                self._warn(f"background poll failed ({type(exc).__name__}: {exc}); retrying")
            if self._halt.wait(self.config.poll_s):
                return

    def _scratch_dir(self) -> Path:
        if self._scratch is None:
            if self.config.scratch_dir:
                self._scratch = Path(self.config.scratch_dir)
                self._scratch.mkdir(parents=True, exist_ok=True)
            else:
                self._scratch = Path(tempfile.mkdtemp(prefix="spotopt-agent-"))
                atexit.register(shutil.rmtree, self._scratch, True)
        return self._scratch

    def _last_step(self) -> int:
        return self._last.step if self._last else 0

    def _settle(self) -> bool:
        """True when nothing is unsaved and every pending trigger is answered by the newest
        checkpoint (False while the store refuses an acknowledgement).

        A request that arrived while a checkpoint of the current step was being written is
        answered by that checkpoint (it holds all progress) rather than by a second one.
        """
        if self._step > self._last_step():
            return False
        return self._answer(dict(self._triggers), self._last)

    def _answer(self, triggers: dict[str, ControlRequest | None], manifest: Manifest | None) -> bool:
        """Clear the triggers a checkpoint satisfied and acknowledge the daemon's requests; a
        request whose acknowledgement the store refused stays pending (tried again after the
        backoff). True when every trigger was answered."""
        now = self._now()
        for reason, request in triggers.items():
            if request is not None and self._loc is not None:
                try:
                    acknowledge(
                        self._loc,
                        request,
                        manifest.name if manifest else None,
                        manifest.step if manifest else None,
                        now,
                    )
                except Exception as exc:  # any back-end's refusal; the daemon waits for the answer
                    self._store_refused(
                        f"acknowledgement of {request.id} not written ({type(exc).__name__}: {exc})"
                    )
                    return False
            self._triggers.pop(reason, None)
        return True

    def _heartbeat(self, state: AgentState) -> None:
        """Write this agent's heartbeat; a store that refuses it is said now and then, never
        raised: a heartbeat is advisory (the daemon judges a silent agent by its instance)."""
        if self._superseded or self._loc is None:
            return
        now, step = self.clock(), self._step
        # Over the interval since the previous heartbeat, and only once that one was past the
        # warm-up (``spotopt.agent.steady``): the daemon records these rates as the job's
        # measured throughput, which a first interval holding compilation or a restore understates.
        steady = None if self._beat is None else steady_rate([self._beat, (now, step)], self._origin)
        self._beat = (now, step)
        last = self._last
        beat = Heartbeat(
            job=self.config.job,
            epoch=self.config.epoch,
            state=state,
            step=step,
            steps_per_s=None if steady is None else steady.steps_per_s,
            last_checkpoint=last.name if last else None,
            last_checkpoint_step=last.step if last else None,
            at=datetime.fromtimestamp(now, UTC),
            reason=self._stop_reason,
        )
        try:
            write_heartbeat(self._loc, beat)
        except Exception as exc:  # any back-end's refusal
            self._warn_now_and_then("heartbeat", f"heartbeat not written ({type(exc).__name__}: {exc})")

    def _supersede(self, message: str) -> None:
        with self._lock:
            if self._superseded is None:
                self._superseded = message
                self._halt.set()

    def _exit_superseded(self) -> NoReturn:
        self._warn(self._superseded or "superseded")
        raise SystemExit(EXIT_SUPERSEDED)
