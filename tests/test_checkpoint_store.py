"""The checkpoint store on file:// and on S3 (moto server): verified writes, torn writes, fencing, GC."""

from __future__ import annotations

import hashlib
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotopt.checkpoints import (
    Location,
    RequestKind,
    acknowledge,
    collect_garbage,
    grant_lease,
    list_checkpoints,
    pending_requests,
    read_acknowledgement,
    read_lease,
    restore_latest,
    send_request,
    trusted_checkpoints,
    write_checkpoint,
)
from spotopt.checkpoints.store import CHECKPOINTS, DATA, MANIFEST
from spotopt.errors import ConfigError, InputError, SupersededError
from tests.stores import StoreUnderTest, azurite, moto_s3, store

__all__ = ["azurite", "moto_s3", "store"]

T0 = datetime(2026, 11, 1, tzinfo=UTC)
JOB = "job-1"


class Crash(Exception):
    """Stands in for the process dying at that instant."""


def _state(directory: Path, step: int) -> Path:
    """A checkpoint's files: two of them, in a subdirectory too, content depending on the step."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "weights.bin").write_bytes(hashlib.sha256(f"w{step}".encode()).digest() * 1000)
    (directory / "opt").mkdir(exist_ok=True)
    (directory / "opt" / "moments.bin").write_bytes(bytes([step % 256]) * 5000)
    return directory


def _write(loc: Location, tmp_path: Path, step: int, epoch: int = 0, keep: int = 3):  # type: ignore[no-untyped-def]
    return write_checkpoint(
        loc, JOB, step, epoch, _state(tmp_path / f"s{step}", step), T0 + timedelta(minutes=step), keep
    )


def _restore(loc: Location, tmp_path: Path) -> tuple[int | None, list[str]]:
    warnings: list[str] = []
    manifest = restore_latest(loc, JOB, read_lease(loc, JOB), tmp_path / "restored", warnings.append)
    if manifest is not None:
        expected = _state(tmp_path / "expected", manifest.step)
        for rel in ("weights.bin", "opt/moments.bin"):
            assert (tmp_path / "restored" / rel).read_bytes() == (expected / rel).read_bytes()
    return (manifest.step if manifest else None), warnings


def _data_path(loc: Location, name: str, rel: str) -> str:
    return loc.path(JOB, CHECKPOINTS, name, DATA, rel)


def test_a_written_checkpoint_is_verified_and_restores_byte_for_byte(
    store: StoreUnderTest, tmp_path: Path
) -> None:
    loc = store.location()
    manifest = _write(loc, tmp_path, 7, epoch=0)
    assert (manifest.job, manifest.step, manifest.epoch) == (JOB, 7, 0)
    assert {f.path for f in manifest.files} == {"weights.bin", "opt/moments.bin"}
    assert manifest.size_bytes == 32_000 + 5_000
    assert [m.name for m in trusted_checkpoints(loc, JOB, None)] == [manifest.name]
    assert _restore(loc, tmp_path) == (7, [])


def test_only_the_newest_k_verified_checkpoints_are_kept(store: StoreUnderTest, tmp_path: Path) -> None:
    loc = store.location()
    for step in (1, 2, 3, 4, 5):
        _write(loc, tmp_path, step, keep=2)
    assert [c.step for c in list_checkpoints(loc, JOB)] == [5, 4]


@pytest.mark.parametrize("crash_at", range(3))
def test_a_write_torn_at_any_point_is_never_resumed_from(
    store: StoreUnderTest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at: int
) -> None:
    """crash_at 0, 1: the process dies half-way through uploading file 0 or 1; 2: before the manifest."""
    loc = store.location()
    _write(loc, tmp_path, 10)
    uploads = []

    def put_file(local: str, path: str) -> None:
        if len(uploads) == crash_at:
            data = Path(local).read_bytes()
            loc.write_bytes(path, data[: len(data) // 2])  # the part that made it before the crash
            raise Crash(path)
        uploads.append(path)
        Location.put_file(loc, local, path)

    def write_json(path: str, data: object) -> None:
        if path.endswith(MANIFEST):
            raise Crash(path)
        Location.write_json(loc, path, data)

    monkeypatch.setattr(loc, "put_file", put_file)
    monkeypatch.setattr(loc, "write_json", write_json)
    with pytest.raises(Crash):
        _write(loc, tmp_path, 20)
    monkeypatch.undo()
    listed = list_checkpoints(loc, JOB)
    assert [(c.step, c.problem) for c in listed] == [(20, "no manifest (torn write)"), (10, None)]
    assert _restore(loc, tmp_path) == (10, [])
    assert collect_garbage(loc, JOB, epoch=0, keep=3) == [listed[0].name]
    assert [c.step for c in list_checkpoints(loc, JOB)] == [10]


def test_a_crash_after_the_manifest_leaves_a_good_checkpoint(
    store: StoreUnderTest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc = store.location()
    _write(loc, tmp_path, 10)
    monkeypatch.setattr(
        "spotopt.checkpoints.store.collect_garbage", lambda *a: (_ for _ in ()).throw(Crash())
    )
    with pytest.raises(Crash):
        _write(loc, tmp_path, 20)
    assert _restore(loc, tmp_path) == (20, [])


def test_an_unreadable_manifest_is_not_a_checkpoint(store: StoreUnderTest, tmp_path: Path) -> None:
    loc = store.location()
    _write(loc, tmp_path, 10)
    bad = _write(loc, tmp_path, 20)
    path = loc.path(JOB, CHECKPOINTS, bad.name, MANIFEST)
    loc.write_bytes(path, loc.fs.cat_file(path)[:40])  # a manifest cut short
    listed = list_checkpoints(loc, JOB)
    assert listed[0].manifest is None and "unreadable manifest" in (listed[0].problem or "")
    assert _restore(loc, tmp_path) == (10, [])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("flip", "sha256 does not match"),
        ("truncate", "has 16000 bytes, the manifest says 32000"),
        ("delete", "weights.bin is missing"),
    ],
)
def test_a_corrupted_file_falls_back_to_the_previous_checkpoint_and_says_so(
    store: StoreUnderTest, tmp_path: Path, damage: str, message: str
) -> None:
    loc = store.location()
    good = _write(loc, tmp_path, 10)
    bad = _write(loc, tmp_path, 20)
    path = _data_path(loc, bad.name, "weights.bin")
    data = loc.fs.cat_file(path)
    if damage == "flip":  # bit rot: same size, one bit different
        loc.write_bytes(path, bytes([data[0] ^ 1]) + data[1:])
    elif damage == "truncate":
        loc.write_bytes(path, data[:16000])
    else:
        loc.remove(path)
    step, warnings = _restore(loc, tmp_path)
    assert step == 10
    assert len(warnings) == 1 and message in warnings[0] and f"falling back to {good.name}" in warnings[0]


def test_all_checkpoints_corrupt_means_start_fresh(store: StoreUnderTest, tmp_path: Path) -> None:
    loc = store.location()
    only = _write(loc, tmp_path, 10)
    loc.remove(_data_path(loc, only.name, "opt/moments.bin"))
    step, warnings = _restore(loc, tmp_path)
    assert step is None and "no older one" in warnings[0]
    assert not (tmp_path / "restored").exists()


def test_a_superseded_epoch_writes_nothing(store: StoreUnderTest, tmp_path: Path) -> None:
    loc = store.location()
    assert grant_lease(loc, JOB, T0).epoch == 1
    _write(loc, tmp_path, 10, epoch=1)
    lease = grant_lease(loc, JOB, T0 + timedelta(hours=1))
    assert lease.epoch == 2 and len(lease.inherited) == 1
    before = [c.name for c in list_checkpoints(loc, JOB)]
    with pytest.raises(SupersededError, match="epoch 1 is not the lease holder"):
        _write(loc, tmp_path, 20, epoch=1)
    assert [c.name for c in list_checkpoints(loc, JOB)] == before
    assert _restore(loc, tmp_path) == (10, [])  # the new epoch resumes from the inherited checkpoint


def test_an_old_epoch_that_wrote_after_the_lease_moved_is_never_resumed_from(
    store: StoreUnderTest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partitioned writer checked the lease, stalled, and wrote its manifest after the grant."""
    loc = store.location()
    grant_lease(loc, JOB, T0)
    _write(loc, tmp_path, 10, epoch=1)
    grant_lease(loc, JOB, T0 + timedelta(hours=1))
    monkeypatch.setattr(
        "spotopt.checkpoints.store.check_epoch", lambda *a: None
    )  # it checked before the grant
    monkeypatch.setattr("spotopt.checkpoints.store.collect_garbage", lambda *a: [])
    stale = _write(loc, tmp_path, 30, epoch=1)
    monkeypatch.undo()
    assert [m.step for m in trusted_checkpoints(loc, JOB, read_lease(loc, JOB))] == [10]
    assert _restore(loc, tmp_path) == (10, [])
    mine = _write(loc, tmp_path, 15, epoch=2)  # the lease holder's next checkpoint collects it
    assert {c.name for c in list_checkpoints(loc, JOB)} == {mine.name, *read_lease(loc, JOB).inherited}
    assert stale.name not in {c.name for c in list_checkpoints(loc, JOB)}


def test_control_requests_reach_only_their_epoch_and_are_acknowledged(store: StoreUnderTest) -> None:
    loc = store.location()
    request = send_request(loc, JOB, 3, RequestKind.CHECKPOINT_AND_STOP, T0)
    assert pending_requests(loc, JOB, 2) == []
    assert pending_requests(loc, JOB, 3) == [request]
    assert read_acknowledgement(loc, JOB, request.id) is None
    acknowledge(loc, request, "000000000010-e3-abcd1234", 10, T0 + timedelta(seconds=5))
    assert pending_requests(loc, JOB, 3) == []
    ack = read_acknowledgement(loc, JOB, request.id)
    assert ack is not None and (ack.checkpoint, ack.step) == ("000000000010-e3-abcd1234", 10)


def test_an_empty_checkpoint_directory_is_refused(store: StoreUnderTest, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="is empty; write the job's state"):
        write_checkpoint(store.location(), JOB, 1, 0, tmp_path / "empty", T0, 3)


def test_bad_store_urls_name_the_setting_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="SPOTOPT_CHECKPOINT_URI: unknown URL scheme 'ftp'"):
        Location("ftp://host/path")
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r'pip install "spotopt-gpu\[gcs\]"'):
        Location("gs://bucket/path")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="SPOTOPT_CHECKPOINT_URI: cannot write to"):
        Location(f"file://{tmp_path / 'file' / 'store'}").check_writable()
