"""Verified checkpoints: write, list, restore with fallback, keep the newest K, collect torn leftovers.

Layout of one job under the store root (docs/guides/agent.md, "Store layout")::

    <root>/<job>/lease.json                          current epoch (see lease.py)
    <root>/<job>/checkpoints/<step>-e<epoch>-<nonce>/data/...   the files the script wrote
    <root>/<job>/checkpoints/<step>-e<epoch>-<nonce>/manifest.json   written last
    <root>/<job>/control/…  heartbeats/…  finished.json   (control.py, heartbeat.py)

A checkpoint counts (*verified*) only when its manifest exists, parses and is trusted by the
lease; ``restore_latest`` re-hashes every file it downloads and falls back to the next older
checkpoint on any mismatch, reporting why through ``warn``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from spotopt.checkpoints.lease import LEASE_FILE, Lease, LeaseHeldError, check_epoch, read_lease
from spotopt.checkpoints.location import Location
from spotopt.checkpoints.manifest import (
    CorruptCheckpointError,
    FileEntry,
    Manifest,
    check_entry,
    hash_stream,
    newest_first,
)
from spotopt.errors import InputError

CHECKPOINTS = "checkpoints"
DATA = "data"
MANIFEST = "manifest.json"


@dataclass(frozen=True, slots=True)
class Listed:
    """One directory under ``checkpoints/``: its manifest, or why it has none that counts."""

    name: str
    step: int
    epoch: int
    manifest: Manifest | None
    problem: str | None


def checkpoint_name(step: int, epoch: int) -> str:
    """Sortable and unique even when two writers save the same step (the nonce)."""
    return f"{step:012d}-e{epoch}-{uuid.uuid4().hex[:8]}"


def parse_checkpoint_name(name: str) -> tuple[int, int] | None:
    """``(step, epoch)`` of a name ``checkpoint_name`` made (None: not one of ours). The epoch
    names the placement that wrote it (the ledger bills moving it out of that region)."""
    parts = name.split("-")
    if (
        len(parts) != 3
        or not parts[0].isdigit()
        or not parts[1].startswith("e")
        or not parts[1][1:].isdigit()
    ):
        return None
    return int(parts[0]), int(parts[1][1:])


def _local_files(local_dir: Path) -> list[Path]:
    return sorted(p for p in local_dir.rglob("*") if p.is_file())


def write_checkpoint(
    loc: Location,
    job: str,
    step: int,
    epoch: int,
    local_dir: Path,
    now: datetime,
    keep: int,
    database: str | None = None,
) -> Manifest:
    """Upload ``local_dir`` as the checkpoint of ``step``, verify it, write its manifest, prune.

    Order (each step is a point where a crash must leave nothing resumable): check the lease,
    upload every file, read each back and compare size and sha256 with the local file, check the
    lease again (``check_epoch``: the epoch and, when ``database`` is known, the granting
    database), write ``manifest.json``. Then keep the newest ``keep`` trusted checkpoints and
    delete torn or fenced leftovers (``collect_garbage``). Raises ``SupersededError`` (nothing
    more is written) if the epoch lost the lease, ``InputError`` for an empty directory.
    """
    files = _local_files(local_dir)
    if not files:
        raise InputError(
            f"checkpoint at step {step}: {local_dir} is empty; write the job's state into the directory "
            "agent.checkpoint() yields, inside the with block"
        )
    check_epoch(loc, job, epoch, database)
    name = checkpoint_name(step, epoch)
    base = loc.path(job, CHECKPOINTS, name)
    entries = []
    for file in files:
        rel = file.relative_to(local_dir).as_posix()
        with file.open("rb") as stream:
            size, sha = hash_stream(stream)
        loc.put_file(str(file), f"{base}/{DATA}/{rel}")
        entries.append(FileEntry(rel, size, sha))
    manifest = Manifest(name, job, step, epoch, now, tuple(entries))
    verify_files(loc, manifest)
    check_epoch(loc, job, epoch, database)
    loc.write_json(f"{base}/{MANIFEST}", manifest.to_json())
    collect_garbage(loc, job, epoch, keep)
    return manifest


def verify_files(loc: Location, manifest: Manifest) -> None:
    """Read every file of ``manifest`` back from the store; ``CorruptCheckpointError`` on a mismatch."""
    base = loc.path(manifest.job, CHECKPOINTS, manifest.name, DATA)
    for entry in manifest.files:
        try:
            with loc.fs.open(f"{base}/{entry.path}", "rb") as stream:
                size, sha = hash_stream(stream)
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(f"checkpoint {manifest.name}: {entry.path} is missing") from exc
        check_entry(entry, size, sha, manifest.name)


def list_checkpoints(loc: Location, job: str) -> list[Listed]:
    """Every checkpoint directory of the job, newest name first, with its parsed manifest if any."""
    found = []
    for name in reversed(loc.names(loc.path(job, CHECKPOINTS))):
        parsed = parse_checkpoint_name(name)
        if parsed is None:
            continue
        path = loc.path(job, CHECKPOINTS, name, MANIFEST)
        try:
            data = loc.read_json(path)
            manifest = None if data is None else Manifest.from_json(data, path)
            problem = "no manifest (torn write)" if manifest is None else None
        except (ValueError, CorruptCheckpointError) as exc:
            manifest, problem = None, f"unreadable manifest ({exc})"
        if manifest is not None and (manifest.name, manifest.job) != (name, job):
            problem = f"manifest names {manifest.job}/{manifest.name}, not {job}/{name}"
            manifest = None
        found.append(Listed(name, parsed[0], parsed[1], manifest, problem))
    return found


def trusted_checkpoints(loc: Location, job: str, lease: Lease | None) -> list[Manifest]:
    """Checkpoints with a manifest that the lease trusts (all of them without a lease), newest first."""
    manifests = [c.manifest for c in list_checkpoints(loc, job) if c.manifest is not None]
    return newest_first(m for m in manifests if lease is None or lease.trusts(m.name, m.epoch))


def download_checkpoint(loc: Location, manifest: Manifest, dest: Path) -> Path:
    """Copy the checkpoint's files into ``dest`` while hashing them; raise on any mismatch.

    ``dest`` is created (replaced if present). On a mismatch it is removed before raising.
    """
    if dest.exists():
        shutil.rmtree(dest)
    base = loc.path(manifest.job, CHECKPOINTS, manifest.name, DATA)
    try:
        for entry in manifest.files:
            target = dest / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with loc.fs.open(f"{base}/{entry.path}", "rb") as src, target.open("wb") as sink:
                    size, sha = hash_stream(src, sink)
            except FileNotFoundError as exc:
                raise CorruptCheckpointError(f"checkpoint {manifest.name}: {entry.path} is missing") from exc
            check_entry(entry, size, sha, manifest.name)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


def restore_latest(
    loc: Location, job: str, lease: Lease | None, dest: Path, warn: Callable[[str], None]
) -> Manifest | None:
    """Download the newest trusted checkpoint that still verifies into ``dest``; None if there is none.

    Each checkpoint that fails verification is reported through ``warn`` and skipped, so a
    flipped bit or a tampered file costs the progress since the previous checkpoint, not the job.
    """
    candidates = trusted_checkpoints(loc, job, lease)
    for i, manifest in enumerate(candidates):
        try:
            download_checkpoint(loc, manifest, dest)
            return manifest
        except CorruptCheckpointError as exc:
            after = f"falling back to {candidates[i + 1].name}" if i + 1 < len(candidates) else "no older one"
            warn(f"{exc}; {after}")
    return None


def collect_garbage(loc: Location, job: str, epoch: int, keep: int) -> list[str]:
    """Delete what can never be resumed from, and verified checkpoints beyond the newest ``keep``.

    Run by the lease holder ``epoch`` right after its own checkpoint verified, so no legitimate
    write is in flight: a directory without a manifest from this or an older epoch is torn, and
    a manifest the lease does not trust was written by a fenced writer. Directories of newer
    epochs are left alone (their writer holds the lease now; we are about to find out).
    """
    keep_names = {m.name for m in trusted_checkpoints(loc, job, read_lease(loc, job))[: max(keep, 1)]}
    removed = []
    for item in list_checkpoints(loc, job):
        if item.epoch <= epoch and item.name not in keep_names:
            loc.remove(loc.path(job, CHECKPOINTS, item.name))
            removed.append(item.name)
    return removed


def grant_lease(
    loc: Location, job: str, now: datetime, epoch: int | None = None, database: str | None = None
) -> Lease:
    """Give the job a new epoch and fence every older writer.

    ``epoch`` None: current + 1 (or 1). A given ``epoch`` makes the grant idempotent, which is
    what a journaled executor needs when it re-does the step after a crash: a lease already at
    ``epoch`` or beyond is returned unchanged. The daemon grants a placement's epoch before it
    launches it (a start) or once the old placement's checkpoint is verified (a move: the new
    placement's agent waits for it).

    ``database``: the granting daemon's database id, recorded in the lease. A lease another
    database holds is never granted over (``LeaseHeldError``, saying how to free the store):
    its epochs are not ours to compare, and the store cannot tell whether that database's job
    still runs (a launch in progress has not written a heartbeat yet, a partitioned agent is
    silent), so freeing it is a person's act.
    """
    current = read_lease(loc, job)
    if database is not None and current is not None and current.database not in (None, database):
        lease_file = f"{loc.url.rstrip('/')}/{job}/{LEASE_FILE}"
        raise LeaseHeldError(
            f"checkpoint store {loc.url}: job {job}'s lease is held by another spotopt database "
            f"(id {current.database[:12]}, epoch {current.epoch}, granted "
            f"{current.granted_at:%Y-%m-%d %H:%M} UTC), whose daemon runs the job there; give this "
            "job its own checkpoint.uri, or, once that "
            f"database no longer runs it, delete {lease_file} and `spotopt jobs retry {job}`"
        )
    if epoch is not None and current is not None and current.epoch >= epoch:
        return current
    inherited = frozenset(m.name for m in trusted_checkpoints(loc, job, current))
    number = epoch if epoch is not None else (current.epoch if current else 0) + 1
    lease = Lease(job, number, now, inherited, database)
    record = {"job": job, "epoch": lease.epoch, "granted_at": now.isoformat(), "inherited": sorted(inherited)}
    if database is not None:
        record["database"] = database
    loc.write_json(loc.path(job, LEASE_FILE), record)
    return lease
