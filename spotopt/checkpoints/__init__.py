"""The checkpoint store: verified checkpoints, the lease, control requests and heartbeats.

Shared by the agent (inside the training job) and the daemon; they talk only through it.
Importing this package imports no fsspec back-end: a ``Location`` opens its URL when built.
"""

from spotopt.checkpoints.control import (
    Acknowledgement,
    ControlRequest,
    RequestKind,
    acknowledge,
    pending_requests,
    read_acknowledgement,
    send_request,
)
from spotopt.checkpoints.heartbeat import (
    AgentState,
    Heartbeat,
    mark_finished,
    read_finished,
    read_heartbeat,
    write_heartbeat,
)
from spotopt.checkpoints.lease import Lease, LeaseHeldError, check_epoch, read_lease
from spotopt.checkpoints.location import Location, store_url
from spotopt.checkpoints.manifest import CorruptCheckpointError, FileEntry, Manifest
from spotopt.checkpoints.store import (
    Listed,
    collect_garbage,
    download_checkpoint,
    grant_lease,
    list_checkpoints,
    parse_checkpoint_name,
    restore_latest,
    trusted_checkpoints,
    verify_files,
    write_checkpoint,
)

__all__ = [
    "Acknowledgement",
    "AgentState",
    "ControlRequest",
    "CorruptCheckpointError",
    "FileEntry",
    "Heartbeat",
    "Lease",
    "LeaseHeldError",
    "Listed",
    "Location",
    "Manifest",
    "RequestKind",
    "acknowledge",
    "check_epoch",
    "collect_garbage",
    "download_checkpoint",
    "grant_lease",
    "list_checkpoints",
    "mark_finished",
    "parse_checkpoint_name",
    "pending_requests",
    "read_acknowledgement",
    "read_finished",
    "read_heartbeat",
    "read_lease",
    "restore_latest",
    "send_request",
    "store_url",
    "trusted_checkpoints",
    "verify_files",
    "write_checkpoint",
    "write_heartbeat",
]
