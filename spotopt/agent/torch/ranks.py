"""The training processes as one: agreement, hand-over from rank 0, and each rank's own stop signal.

Only rank 0 runs the agent (store, lease, heartbeats, control requests, notices). Every other
rank learns its decisions through collectives, so all ranks checkpoint, stop and exit at the
same step. Without an initialised process group there is one rank and every collective is the
identity, so the single-process path is the same code.

A stop can also start on another rank: SIGTERM reaches each process of the group, and on a
node other than rank 0's, that node's first process (``LOCAL_RANK`` 0) polls the cloud's notice
endpoint itself. Such a rank raises its flag in the next agreement and rank 0 asks its agent to
checkpoint and stop.
"""

from __future__ import annotations

import pickle
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from spotopt.agent.config import AgentConfig
from spotopt.agent.notices import poller_for
from spotopt.clouds.common.notices import NoticeKind

T = TypeVar("T")
_pinned: list[tuple[Any, tuple[torch.Tensor, ...]]] = []
"""The newest collectives' work objects and tensors (see ``Ranks._broadcast``)."""


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    device: torch.device
    """Where collectives' tensors live: the current CUDA device for NCCL, else the CPU."""

    @classmethod
    def current(cls) -> Ranks:
        if not (dist.is_available() and dist.is_initialized()):
            return cls(0, 1, torch.device("cpu"))
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        return cls(dist.get_rank(), dist.get_world_size(), device)

    def agree(self, flags: list[int]) -> list[int]:
        """Each flag's maximum over all ranks (one small all-reduce)."""
        if self.world == 1:
            return flags
        tensor = torch.tensor(flags, dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [int(v) for v in tensor.tolist()]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` on rank 0 (rank order); other ranks get an empty list."""
        if self.world == 1:
            return [value]
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(value, out, dst=0)
        return out or []

    def from_zero(self, work: Callable[[], T]) -> T:
        """Run ``work`` on rank 0 and give every rank its result.

        If ``work`` exits the process (a stop, a superseded epoch) or fails, every rank exits
        with the same status or fails too, instead of waiting for rank 0 in a collective. Before
        exiting, the ranks meet once more and destroy the process group: a process that exits
        with a live gloo group can abort ("terminate called without an active exception").
        """
        outcome: tuple[str, Any] | None = None
        if self.rank == 0:
            try:
                outcome = ("ok", work())
            except SystemExit as exc:
                self._broadcast(("exit", exc.code))
                self._leave()
                raise
            except BaseException as exc:
                self._broadcast(("error", f"{type(exc).__name__}: {exc}"))
                raise
        outcome = self._broadcast(outcome)
        assert outcome is not None
        kind, detail = outcome
        if kind == "exit":
            self._leave()
            raise SystemExit(detail)
        if kind == "error":
            raise RuntimeError(f"rank 0 failed: {detail}")
        return detail

    def _broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank, its collectives' work objects kept referenced.

        Not ``broadcast_object_list``: it drops its work objects at once, so a gloo worker
        thread frees them, and freeing a work's tensors takes the GIL. If that is still pending
        when the main thread, holding the GIL, destroys the group (DDP's reducer freed at exit),
        the process hangs (seen with torch 2.13: ``~ProcessGroupGloo`` joins a thread waiting in
        ``decref_pyobject``). Works referenced here are freed by Python, on the main thread.
        """
        if self.world == 1:
            return value
        size = torch.tensor([0], dtype=torch.int64, device=self.device)
        if self.rank == 0:
            data = pickle.dumps(value)
            size.fill_(len(data))
        _pin(dist.broadcast(size, src=0, async_op=True), size)
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        _pin(dist.broadcast(payload, src=0, async_op=True), payload)
        if self.rank == 0:
            return value
        return pickle.loads(payload.cpu().numpy().tobytes())  # from rank 0 of this same job

    def _leave(self) -> None:
        if self.world > 1:
            self.barrier()
            dist.destroy_process_group()

    def barrier(self) -> None:
        if self.world > 1:
            _pin(dist.barrier(async_op=True))


def _pin(work: Any, *tensors: torch.Tensor) -> None:
    """Wait for ``work``; keep it and its tensors referenced until four newer ones are (``_broadcast``)."""
    work.wait()
    _pinned.append((work, tensors))
    del _pinned[:-4]


class LocalStop:
    """A stop asked of this process alone (not rank 0): SIGTERM, or a notice polled on its node."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._installed = False

    def install(self, ranks: Ranks, environ: Mapping[str, str]) -> None:
        """Listen for SIGTERM (if nobody else does) and, on another node's first process of a
        managed job, poll the cloud's preemption notice."""
        if self._installed or ranks.rank == 0:
            return
        self._installed = True
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda _sig, _frame: self._set(f"SIGTERM on rank {ranks.rank}"))
        if "SPOTOPT_JOB" in environ and environ.get("LOCAL_RANK", "0") == "0":
            config = AgentConfig.from_environ(environ)
            poller = poller_for(config)
            if poller is not None:
                threading.Thread(
                    target=self._poll, args=(poller, config.poll_s, ranks.rank), daemon=True
                ).start()

    def _set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def _poll(self, poller: Any, every_s: float, rank: int) -> None:
        while self.reason is None:
            try:
                notice = poller.poll()
            except Exception:  # a flaky metadata service must not kill training; poll again
                notice = None
            if notice is not None and notice.kind is NoticeKind.PREEMPT:
                self._set(f"{notice.cloud} preemption notice on rank {rank}: {notice.detail}")
            time.sleep(every_s)
