"""Where a job's store lives: an fsspec URL opened once, plus the few primitives every part uses.

fsspec (and the cloud back-end behind a URL) is imported on first use, not at import time, so a
training script that imports ``spotopt.agent`` stays fast to start (fsspec alone costs ~0.2 s).
The cloud back-ends are extras; a missing one is a ``ConfigError`` naming the pip command.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotopt import pip_install_hint
from spotopt.errors import ConfigError, one_line

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

URI_SETTING = "SPOTOPT_CHECKPOINT_URI"

# scheme -> (module that implements it, spotopt extra that installs it); None: built into fsspec.
BACKENDS: dict[str, tuple[str, str] | None] = {
    "file": None,
    "s3": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure-storage"),
    "abfs": ("adlfs", "azure-storage"),
}


def scheme_of(url: str) -> str:
    """``s3://b/p`` → ``s3``; a plain path is ``file``."""
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def store_url(text: str, base: Path) -> str:
    """A store as given by a user: a URL as it is, a path as a ``file://`` URL resolved against
    ``base`` (the job file's directory, or the working directory)."""
    return text if "://" in text else f"file://{(base / text).resolve()}"


class Location:
    """An opened store URL: the filesystem, the root path inside it, JSON and atomic writes.

    ``setting`` names the option the URL came from, so every error can say what to fix.
    """

    def __init__(
        self, url: str, storage_options: Mapping[str, Any] | None = None, setting: str = URI_SETTING
    ) -> None:
        scheme = scheme_of(url)
        if scheme not in BACKENDS:
            raise ConfigError(
                f"{setting}: unknown URL scheme {scheme!r} in {url!r}; use file://, s3://, gs:// or az://"
            )
        backend = BACKENDS[scheme]
        if backend is not None:
            module, extra = backend
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ConfigError(
                    f"{setting}: {scheme}:// needs the {module} package; "
                    f"install it with {pip_install_hint(extra)}"
                ) from exc
        import fsspec.core

        self.url = url
        self.setting = setting
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self.fs: AbstractFileSystem = fs
        self.root: str = root.rstrip("/")
        self.is_local = scheme == "file"

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write one object so that readers see all of it or nothing.

        Object stores replace an object atomically on PUT; on a local disk we write a temporary
        file next to the target and rename it (a rename within a directory is atomic).
        """
        if self.is_local:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def put_file(self, local: str, path: str) -> None:
        """Upload a local file (object stores have no directories; a local disk needs them made)."""
        if self.is_local:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.put_file(local, path)

    def write_json(self, path: str, data: Any) -> None:
        self.write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode())

    def read_json(self, path: str) -> Any | None:
        """The parsed object, or None when it does not exist. Malformed JSON raises ``ValueError``."""
        try:
            raw = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return json.loads(raw)

    def names(self, path: str) -> list[str]:
        """Base names of the entries directly under ``path`` (empty when it does not exist)."""
        self.fs.invalidate_cache(path)  # another process (daemon, agent) may have written since
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        prefix = path.rstrip("/") + "/"
        return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries if str(e).startswith(prefix))

    def remove(self, path: str) -> None:
        """Delete a file or a directory tree; a missing path is not an error (GC may race)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(path, recursive=True)

    def check_writable(self) -> None:
        """Write and delete a probe object; a store we cannot write is a ``ConfigError`` up front."""
        self._probe(self.path(f".spotopt-probe-{uuid.uuid4().hex[:8]}"), make_root=True)

    def check_reachable(self) -> None:
        """Like ``check_writable``, without creating anything that stays: a local store's nearest
        existing directory must take a file, an object store's bucket must take an object. What
        ``spotopt jobs submit`` checks (no directory or bucket made on the submitter's side)."""
        name = f".spotopt-probe-{uuid.uuid4().hex[:8]}"
        if not self.is_local:
            self._probe(self.path(name), make_root=False)
            return
        existing = Path(self.root)
        while not existing.exists():
            existing = existing.parent
        self._probe(str(existing / name), make_root=False)

    def _probe(self, probe: str, *, make_root: bool) -> None:
        """Write and delete ``probe`` (after making the store's root with ``make_root``); any
        failure is a ``ConfigError`` naming the setting and the store."""
        try:
            if make_root:
                self.fs.makedirs(self.root, exist_ok=True)
            elif self.is_local and not Path(probe).parent.is_dir():
                raise NotADirectoryError(f"{Path(probe).parent} is not a directory")
            self.fs.pipe_file(probe, b"ok")
            self.fs.rm(probe)
        except Exception as exc:  # any back-end's permission / missing-bucket / network error
            raise ConfigError(
                f"{self.setting}: cannot write to {self.url} ({one_line(exc)}); "
                "point it at a directory or bucket this process may write"
            ) from exc
