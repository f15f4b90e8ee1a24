"""A PyTorch training state as one file: model, optimizer, scheduler, grad scaler, extras, every RNG.

Resuming is bit-identical only when *everything* a step reads is restored, so besides the state
dicts the file holds every random number generator a training step may draw from: Python's
``random``, NumPy's legacy global generator, torch's CPU generator and, when CUDA is in use,
each device's generator, one set per rank (ranks draw different dropout masks).

The file is written with ``torch.save`` and read with ``weights_only=True``: the agent's store
verifies checksums, but a checkpoint should still never be able to run code when loaded, so
extras must be tensors, numbers, strings and containers of them (or objects with
``state_dict``/``load_state_dict``, which are saved through those).
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

STATE_FILE = "training-state.pt"
FORMAT = 1
"""Bumped when the file's layout changes; a newer file is refused rather than half-applied."""


@dataclass(frozen=True)
class Parts:
    """What the training loop hands over; None means the loop has no such part."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    """Anything with ``state_dict``/``load_state_dict`` (an LR scheduler)."""
    scaler: Any = None
    """A ``torch.amp.GradScaler`` (or anything with ``state_dict``/``load_state_dict``)."""
    extra: MutableMapping[str, Any] | None = None
    """User state: values with ``state_dict`` are saved through it and restored in place; other
    values are saved as they are and put back into the mapping on resume."""


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose parameters are the model's, without DDP's ``module.`` or
    ``torch.compile``'s ``_orig_mod.`` prefix, so a checkpoint loads with or without them."""
    while True:
        wrapper = isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel)
        inner = model.module if wrapper else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def rng_state() -> dict[str, Any]:
    """Every generator a training step may draw from, as plain data (``weights_only``-loadable)."""
    legacy = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": legacy["bit_generator"],
            "key": torch.from_numpy(legacy["state"]["key"].astype(np.int64)),
            "pos": int(legacy["state"]["pos"]),
            "has_gauss": int(legacy["has_gauss"]),
            "gauss": float(legacy["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    # Only where CUDA is already in use: asking an idle GPU for its state would initialise it.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Every generator as it was, after the agent's own work inside: the store's libraries may
    draw from the global ones (opening an S3 store imports httpx, which imports rich, whose
    styles draw a random id at import), and a checkpoint must not move the training's streams."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state, lambda _message: None)


def set_rng_state(state: dict[str, Any], warn: Callable[[str], None]) -> None:
    """Put every generator back where ``rng_state`` found it (CUDA's only on as many devices)."""
    random.setstate(_tuples(state["python"]))
    numpy = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": numpy["bit_generator"],
            "state": {"key": numpy["key"].numpy().astype(np.uint32), "pos": numpy["pos"]},
            "has_gauss": numpy["has_gauss"],
            "gauss": numpy["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            warn(
                f"the checkpoint holds the RNG states of {len(cuda)} CUDA devices but this process "
                f"sees {torch.cuda.device_count()}: CUDA generators start fresh (not bit-identical)"
            )


def _tuples(value: Any) -> Any:
    """``random.setstate`` wants the tuples it gave; pickling keeps them, this guards lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list | tuple) else value


def capture(step: int, parts: Parts, rngs: list[dict[str, Any]]) -> dict[str, Any]:
    """The file's content for ``step``: ``rngs`` holds one RNG state per rank, rank 0 first."""
    return {
        "format": FORMAT,
        "step": step,
        "model": unwrap(parts.model).state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else None,
        "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
        "extra": {
            key: value.state_dict() if hasattr(value, "state_dict") else value
            for key, value in (parts.extra or {}).items()
        },
        "rng": rngs,
    }


def to_bytes(payload: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> dict[str, Any]:
    payload: dict[str, Any] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if payload.get("format") != FORMAT:
        raise RuntimeError(
            f"{STATE_FILE} has format {payload.get('format')!r}; this spotopt reads format {FORMAT}: "
            "resume with the spotopt version that wrote it"
        )
    return payload


def apply(payload: dict[str, Any], parts: Parts, rank: int, warn: Callable[[str], None]) -> None:
    """Load every part and this rank's RNG state; a part the checkpoint lacks is an error.

    With more ranks than the checkpoint was written by (the job moved to a bigger machine) the
    new ranks keep their own generators: training goes on, but no longer bit-identically.
    """
    unwrap(parts.model).load_state_dict(payload["model"])
    parts.optimizer.load_state_dict(payload["optimizer"])
    for name, part in (("scheduler", parts.scheduler), ("scaler", parts.scaler)):
        if part is None:
            continue
        if payload[name] is None:
            raise RuntimeError(f"the checkpoint was written without a {name}; pass {name}=None to resume it")
        part.load_state_dict(payload[name])
    if parts.extra is not None:
        for key, value in payload["extra"].items():
            current = parts.extra.get(key)
            if current is not None and hasattr(current, "load_state_dict"):
                current.load_state_dict(value)
            else:
                parts.extra[key] = value
    rngs = payload["rng"]
    if rank < len(rngs):
        set_rng_state(rngs[rank], warn)
    else:
        warn(
            f"the checkpoint holds the RNG states of {len(rngs)} ranks, not of rank {rank}: "
            "its generators start fresh (not bit-identical to an uninterrupted run)"
        )
