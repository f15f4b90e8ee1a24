"""The manifest: the last object of a checkpoint, and the only proof that the rest is complete.

``manifest.json`` lists every file of the checkpoint with its size in bytes and its sha256. It is
written after all files were uploaded *and read back and checked*, so a checkpoint without a
manifest is torn by definition, and one whose files no longer match it is corrupt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

FORMAT = 1
CHUNK_BYTES = 8 * 1024 * 1024


class CorruptCheckpointError(ValueError):
    """A manifest that does not parse, or a file that does not match its manifest entry."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    """Relative to the checkpoint directory, ``/``-separated."""
    size_bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    name: str
    """The checkpoint's directory name in the store (``<step>-e<epoch>-<nonce>``)."""
    job: str
    step: int
    epoch: int
    created_at: datetime
    files: tuple[FileEntry, ...]

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "job": self.job,
            "step": self.step,
            "epoch": self.epoch,
            "created_at": self.created_at.isoformat(),
            "files": [{"path": f.path, "size_bytes": f.size_bytes, "sha256": f.sha256} for f in self.files],
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Manifest:
        """Parse a manifest; anything unexpected is a ``CorruptCheckpointError`` naming ``where``."""
        try:
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r} is not {FORMAT}")
            created = datetime.fromisoformat(data["created_at"])
            if created.tzinfo is None:
                raise ValueError("created_at has no time zone")
            files = tuple(
                FileEntry(str(f["path"]), int(f["size_bytes"]), str(f["sha256"])) for f in data["files"]
            )
            return cls(
                str(data["name"]), str(data["job"]), int(data["step"]), int(data["epoch"]), created, files
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptCheckpointError(f"{where}: unreadable manifest ({exc})") from exc


def hash_stream(stream: IO[bytes], sink: IO[bytes] | None = None) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a stream read to its end, copying it to ``sink`` if given."""
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK_BYTES):
        digest.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
    return size, digest.hexdigest()


def check_entry(entry: FileEntry, size: int, sha256: str, checkpoint: str) -> None:
    """Raise ``CorruptCheckpointError`` when a file's measured size or checksum differs."""
    if size != entry.size_bytes:
        raise CorruptCheckpointError(
            f"checkpoint {checkpoint}: {entry.path} has {size} bytes, the manifest says {entry.size_bytes}"
        )
    if sha256 != entry.sha256:
        raise CorruptCheckpointError(
            f"checkpoint {checkpoint}: {entry.path} sha256 does not match the manifest"
        )


def newest_first(manifests: Iterable[Manifest]) -> list[Manifest]:
    """Order by step, then epoch, then creation time: the most advanced state first."""
    return sorted(manifests, key=lambda m: (m.step, m.epoch, m.created_at), reverse=True)
