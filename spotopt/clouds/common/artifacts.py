"""What an instance installs: the daemon's own distribution as a wheel, and a lock of its dependencies.

Nothing an instance runs is chosen by an index on the day it boots. The daemon puts two files in
the job's checkpoint store, content-addressed (``<store root>/_spotopt/artifacts/<sha256>/<file>``;
no job name starts with ``_``), and the start-up script downloads them with the instance's own
identity (``spotopt.clouds.common.fetch``), checks both sha256 sums that the script carries, and runs
``pip install --require-hashes --only-binary :all:`` of the lock plus the wheel:

- **the wheel** is ``bootstrap_wheel`` when set (its name and version must be the running
  daemon's), else built from what runs the daemon: an editable install is built from its source
  tree; an installed wheel is packed again from its installed files, each checked against the
  distribution's ``RECORD`` hashes first (a modified install is refused, not shipped). Zip
  timestamps are fixed, so the same code gives the same sha256 and is uploaded once;
- **the lock** is ``bootstrap_lock`` when set, else the lock this distribution ships for the
  store's extra (``spotopt/data/locks/instance-<extra>.txt``, made by ``.ci/lock``). Every
  requirement in it must be pinned with ``==`` and carry ``--hash=sha256:``; and every package
  it pins that the daemon also has must be at the daemon's version, so an instance runs the
  dependencies the daemon runs. Index options inside it are refused: ``bootstrap_index_url``
  names the index.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotopt import DISTRIBUTION
from spotopt.checkpoints.location import BACKENDS, Location, scheme_of
from spotopt.errors import ConfigError
from spotopt.settings import Settings

ARTIFACTS = "_spotopt/artifacts"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
"""Every member's timestamp in a packed wheel (zip's earliest), so equal contents hash equally."""
SOURCE_DATE_EPOCH = "315532800"
"""1980-01-01 for ``bdist_wheel`` of an editable install's source tree, for the same reason."""
# ``name[extras]==version ; marker --hash=sha256:… …`` (a uv/pip-compile line, continuations
# joined); a marker never holds " --", so the first --hash ends it.
_PIN = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)\s*"  # name[extras]==version
    r"(;(?:(?! --).)*)?\s*(--hash=sha256:[0-9a-f]{64}\s*)+$"  # ; marker, then only hashes
)


@dataclass(frozen=True, slots=True)
class Artifact:
    """One shipped file: its key under the store root, sha256, and the name pip needs on disk."""

    key: str
    sha256: str
    file_name: str


@dataclass(frozen=True, slots=True)
class Shipment:
    """What the start-up script downloads and installs for one store."""

    wheel: Artifact
    lock: Artifact
    requirement: str
    """The wheel's requirement with the store's extra, e.g. ``spotopt-gpu[s3]``."""


def normalize(name: str) -> str:
    """PEP 503's normalized project name (``Spotopt_GPU`` → ``spotopt-gpu``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def store_extra(store_url: str) -> str | None:
    """The extra that installs the back-end of ``store_url`` (None for ``file://``)."""
    backend = BACKENDS.get(scheme_of(store_url))
    return backend[1] if backend else None


# -- the wheel -------------------------------------------------------------------------------


def _b64_sha256(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel_tag(dist: importlib.metadata.Distribution) -> str:
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    return tags[0] if tags else "py3-none-any"


def _repack(dist: importlib.metadata.Distribution, out_dir: Path) -> Path:
    """A wheel of the installed files of ``dist``, each checked against its ``RECORD`` hash."""
    version = dist.version
    name = normalize(dist.metadata["Name"]).replace("-", "_")
    info = f"{name}-{version}.dist-info"
    skipped = {f"{info}/RECORD", f"{info}/INSTALLER", f"{info}/REQUESTED", f"{info}/direct_url.json"}
    members: list[tuple[str, bytes]] = []
    for entry in sorted(dist.files or [], key=str):
        path = str(entry).replace(os.sep, "/")
        if path.startswith("..") or "__pycache__/" in path or path in skipped:
            continue  # console scripts (pip writes them from entry_points.txt), bytecode, installer's files
        data = Path(str(dist.locate_file(entry))).read_bytes()
        if entry.hash is None or entry.hash.mode != "sha256" or entry.hash.value != _b64_sha256(data):
            raise ConfigError(
                f"{DISTRIBUTION} {version}: installed file {path} does not match its RECORD hash; "
                f"reinstall {DISTRIBUTION}, or set SPOTOPT_BOOTSTRAP_WHEEL to the wheel you installed"
            )
        members.append((path, data))
    record = "".join(f"{p},sha256={_b64_sha256(d)},{len(d)}\n" for p, d in members) + f"{info}/RECORD,,\n"
    members.append((f"{info}/RECORD", record.encode()))
    target = out_dir / f"{name}-{version}-{_wheel_tag(dist)}.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in members:
            member = zipfile.ZipInfo(path, ZIP_TIME)
            member.external_attr = 0o644 << 16
            member.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(member, data)
    return target


def _editable_source(dist: importlib.metadata.Distribution) -> Path | None:
    """The source tree of an editable install (pip's ``direct_url.json``), else None."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    direct = json.loads(text)
    if not direct.get("dir_info", {}).get("editable") or not str(direct.get("url", "")).startswith("file://"):
        return None
    return Path(direct["url"].removeprefix("file://"))


def _build(source: Path, out_dir: Path) -> Path:
    """``pip wheel`` of an editable install's source tree: that tree is what the daemon runs."""
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w"]
    done = subprocess.run([*command, str(out_dir), str(source)], env=env, capture_output=True, text=True)
    wheels = sorted(out_dir.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise ConfigError(
            f"{DISTRIBUTION}: building a wheel of {source} failed ({done.stderr.strip()[-300:]}); "
            "set SPOTOPT_BOOTSTRAP_WHEEL to a wheel of this version"
        )
    return wheels[0]


def check_wheel(path: Path, version: str) -> None:
    """``path`` is a wheel of this distribution at ``version`` (the running daemon's)."""
    if path.suffix != ".whl" or not path.is_file():
        raise ConfigError(
            f"bootstrap_wheel: {str(path)!r} is not a wheel file; instances install only the daemon's own "
            "distribution: give the path of its .whl (or leave SPOTOPT_BOOTSTRAP_WHEEL unset to build one)"
        )
    name, wheel_version = path.name.split("-")[:2]
    if normalize(name) != DISTRIBUTION or wheel_version != version:
        raise ConfigError(
            f"bootstrap_wheel: {path.name} is {name} {wheel_version}, but the daemon runs {DISTRIBUTION} "
            f"{version}; give a wheel of {DISTRIBUTION} {version} in SPOTOPT_BOOTSTRAP_WHEEL"
        )


def installed() -> importlib.metadata.Distribution:
    """The installed distribution that runs: the one an installer recorded (``RECORD``), not an
    ``*.egg-info`` build leftover that a source tree on ``sys.path`` also offers."""
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        if dist.read_text("RECORD") is not None:
            return dist
    raise ConfigError(
        f"{DISTRIBUTION} is not installed (pip install .); instances need the daemon's own distribution"
    )


@functools.cache
def own_wheel(named: str | None) -> tuple[str, bytes]:
    """(file name, bytes) of the wheel instances install: ``named`` (``bootstrap_wheel``) or one
    made from the installed distribution (module doc). Made once per process."""
    dist = installed()
    if named:
        path = Path(named).expanduser()
        check_wheel(path, dist.version)
        return path.name, path.read_bytes()
    with tempfile.TemporaryDirectory(prefix="spotopt-wheel-") as tmp:
        source = _editable_source(dist)
        wheel = _build(source, Path(tmp)) if source is not None else _repack(dist, Path(tmp))
        return wheel.name, wheel.read_bytes()


# -- the lock --------------------------------------------------------------------------------


def lock_lines(text: str) -> list[str]:
    """The requirement lines of a requirements file (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\s*\n", " ", text)
    lines = (line.split(" #", 1)[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def check_lock(text: str, where: str) -> dict[str, set[str]]:
    """Refuse a lock that is not hash-pinned throughout; returns name → pinned versions."""
    pins: dict[str, set[str]] = {}
    for line in lock_lines(text):
        match = _PIN.match(line)
        if match is None:
            raise ConfigError(
                f"{where}: {line[:80]!r} is not a requirement pinned with == and --hash=sha256: "
                "(no options, URLs or bare names); regenerate the lock with hashes"
            )
        name = normalize(match.group(1))
        if name in (DISTRIBUTION, "spotopt"):
            raise ConfigError(
                f"{where}: {line[:60]!r}: the lock must not name spotopt; the daemon ships its wheel"
            )
        pins.setdefault(name, set()).add(match.group(3))
    if not pins:
        raise ConfigError(f"{where}: the lock pins nothing; give a requirements file with hashes")
    return pins


def check_daemon_matches(pins: Mapping[str, set[str]], where: str) -> None:
    """Every package the lock pins that the daemon has is at the daemon's version."""
    differ = []
    for name, versions in sorted(pins.items()):
        try:
            mine = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if mine not in versions:
            differ.append(f"{name} {mine} (lock: {', '.join(sorted(versions))})")
    if differ:
        shown = "; ".join(differ[:3]) + (f"; and {len(differ) - 3} more" if len(differ) > 3 else "")
        raise ConfigError(
            f"{where}: instances would run other versions than the daemon: {shown}; install the daemon "
            f"from that lock (pip install --require-hashes -r LOCK) or set SPOTOPT_BOOTSTRAP_LOCK to a lock "
            "of the daemon's own versions"
        )


def instance_lock(named: str | None, store_url: str) -> tuple[str, bytes]:
    """(where it came from, bytes) of the lock for a store: ``named`` or the shipped one."""
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"bootstrap_lock: {named!r} is not a file; give a requirements file with hashes"
            )
        return f"bootstrap_lock {named}", path.read_bytes()
    name = f"instance-{store_extra(store_url) or 'file'}.txt"
    return f"{DISTRIBUTION}'s {name}", importlib.resources.files("spotopt.data").joinpath(
        "locks", name
    ).read_bytes()


def check_install(settings: Settings) -> None:
    """What the daemon checks before its first round: the settings, the named wheel's name and
    version, and every lock an instance could get (hash-pinned, at the daemon's versions). The
    default wheel is built at the first launch instead (it takes seconds)."""
    settings.check_bootstrap()
    if settings.bootstrap_wheel:
        check_wheel(Path(settings.bootstrap_wheel).expanduser(), installed().version)
    stores = ["file:///"] if settings.bootstrap_lock else ["file:///", "s3://b", "gs://b", "az://c"]
    for store in stores:
        where, lock = instance_lock(settings.bootstrap_lock, store)
        check_daemon_matches(check_lock(lock.decode("utf-8"), where), where)


# -- shipping --------------------------------------------------------------------------------


def _artifact(file_name: str, data: bytes) -> Artifact:
    sha = hashlib.sha256(data).hexdigest()
    return Artifact(f"{ARTIFACTS}/{sha}/{file_name}", sha, file_name)


def _upload(loc: Location, artifact: Artifact, data: bytes) -> None:
    """Put ``data`` at its content address unless it is there already, and read it back."""
    path = loc.path(*artifact.key.split("/"))
    try:
        present = loc.fs.cat_file(path)
    except FileNotFoundError:
        present = None
    if present is None or hashlib.sha256(present).hexdigest() != artifact.sha256:
        loc.write_bytes(path, data)
        if hashlib.sha256(loc.fs.cat_file(path)).hexdigest() != artifact.sha256:
            raise ConfigError(f"{loc.url}: {artifact.key} read back differs from what was written")


def prepare(settings: Settings, store_url: str) -> tuple[Artifact, bytes, Artifact, bytes]:
    """The wheel and lock for ``store_url``, checked (no store access)."""
    settings.check_bootstrap()
    wheel_name, wheel = own_wheel(settings.bootstrap_wheel)
    where, lock = instance_lock(settings.bootstrap_lock, store_url)
    pins = check_lock(lock.decode("utf-8"), where)
    check_daemon_matches(pins, where)
    return _artifact(wheel_name, wheel), wheel, _artifact("requirements.txt", lock), lock


_SHIPPED: dict[tuple[str, str, str, str], Shipment] = {}


def ship(settings: Settings, store_url: str, storage_options: Mapping[str, Any]) -> Shipment:
    """Put the wheel and the lock into the store at ``store_url``; once per store and content."""
    wheel_art, wheel, lock_art, lock = prepare(settings, store_url)
    extra = store_extra(store_url)
    requirement = f"{DISTRIBUTION}[{extra}]" if extra else DISTRIBUTION
    key = (store_url, json.dumps(dict(storage_options), sort_keys=True), wheel_art.sha256, lock_art.sha256)
    if key not in _SHIPPED:
        loc = Location(store_url, storage_options, setting="checkpoint store")
        _upload(loc, wheel_art, wheel)
        _upload(loc, lock_art, lock)
        _SHIPPED[key] = Shipment(wheel_art, lock_art, requirement)
    return _SHIPPED[key]
