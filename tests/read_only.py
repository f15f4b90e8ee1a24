"""A directory that refuses writes for real (EPERM/EACCES from the kernel, not a mock): what the
store-outage tests make of a job's checkpoint store for a while."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def refuse_writes(directory: Path) -> None:
    """``directory`` takes no new entry and loses none: real writes into it fail with EPERM or
    EACCES. Root ignores permission bits, so as root the directory is made immutable
    (``chattr +i``, ext4/xfs/btrfs with CAP_LINUX_IMMUTABLE); otherwise it is made read-only."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(directory)], check=True, capture_output=True)
    else:
        directory.chmod(0o555)
    probe = directory / ".probe"
    try:
        probe.touch()
    except PermissionError:
        return
    probe.unlink()
    allow_writes(directory)
    raise RuntimeError(f"{directory} still takes writes: this machine cannot play store-errors")


def allow_writes(directory: Path) -> None:
    """Undo ``refuse_writes`` (nothing to do for a directory that is not there)."""
    if not directory.is_dir():
        return
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], check=True, capture_output=True)
    else:
        directory.chmod(0o755)
