"""``spotopt agent``: run a training script under the agent on this machine, resuming until done."""

from __future__ import annotations

import json
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from time import sleep
from types import FrameType
from typing import Annotated, Any

import typer

from spotopt.agent.config import JOB_NAME
from spotopt.checkpoints import Location, grant_lease, read_finished, store_url
from spotopt.cli.common import FormatOption, directory, parse_duration
from spotopt.clouds.common.base import InstanceStatus, LaunchSpec
from spotopt.clouds.local.provider import LOCAL_MARKET, LocalProvider
from spotopt.clouds.registry import get_provider
from spotopt.errors import InputError, ProviderError
from spotopt.render import Format, render

app = typer.Typer(no_args_is_help=True, help="Run training scripts under the spotopt agent.")

POLL_S = 0.2


@app.command("run-local", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_local(
    script: Annotated[
        Path, typer.Argument(help="The training script (Python); its own arguments follow --.")
    ],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments for the script, after --.")] = None,
    store: Annotated[
        str,
        typer.Option("--store", help="Checkpoint store URL: file://DIR, s3://BUCKET/PREFIX, gs://…, az://…"),
    ] = "spotopt-checkpoints",
    job: Annotated[
        str | None, typer.Option("--job", help="Job name (default: the script's file name).")
    ] = None,
    checkpoint_every: Annotated[
        str | None,
        typer.Option("--checkpoint-every", help="Checkpoint period, e.g. 30s (default: Young/Daly)."),
    ] = None,
    storage_options: Annotated[
        str | None,
        typer.Option("--storage-options", help='JSON for the store back-end, e.g. {"endpoint_url": "…"}.'),
    ] = None,
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="Where the local provider records its processes and logs.")
    ] = Path("spotopt-local"),
    restarts: Annotated[
        int, typer.Option("--restarts", min=0, help="Relaunch (resuming) this many times after a crash.")
    ] = 3,
    grace: Annotated[
        str, typer.Option("--grace", help="On Ctrl-C: time to checkpoint before SIGKILL.")
    ] = "60s",
    fmt: FormatOption = Format.TABLE,
) -> None:
    """Run SCRIPT as a local job under the agent; relaunch it from its last verified checkpoint
    after a crash until it finishes. Ctrl-C asks it to checkpoint and stop."""
    if not script.is_file():
        raise InputError(f"SCRIPT: {script} is not a file")
    name = job or script.stem
    if not JOB_NAME.match(name):
        raise InputError(f"--job: {name!r} is not a job name; use letters, digits, '.', '_' and '-'")
    every = (
        parse_duration(checkpoint_every, "--checkpoint-every").total_seconds() if checkpoint_every else None
    )
    if every is not None and every <= 0:
        raise InputError(f"--checkpoint-every: {checkpoint_every!r} must be longer than 0s")
    grace_s = parse_duration(grace, "--grace").total_seconds()
    options = _options(storage_options)
    loc = Location(store_url(store, Path.cwd()), options, setting="--store")
    loc.check_writable()
    provider = get_provider("local", state_dir=directory(state_dir, "--state-dir").resolve(), grace_s=grace_s)
    assert isinstance(provider, LocalProvider)
    command = (sys.executable, str(script.resolve()), *(args or []))
    rows: list[dict[str, Any]] = []
    for _ in range(restarts + 1):
        lease = grant_lease(loc, name, datetime.now(UTC))
        spec = LaunchSpec(name, lease.epoch, command, loc.url, options, checkpoint_every_s=every)
        instance = provider.launch(
            spec, LOCAL_MARKET, f"{name}-epoch-{lease.epoch}-{lease.granted_at.isoformat()}"
        )
        typer.echo(
            f"{name}: epoch {lease.epoch} running as {instance.instance_id} (log: "
            f"{provider.log_path(instance.instance_id)})",
            err=True,
        )
        status = _follow(provider, instance.instance_id)
        finished = read_finished(loc, name)
        rows.append(
            {
                "job": name,
                "epoch": lease.epoch,
                "instance_id": instance.instance_id,
                "state": str(status.state),
                "exit_code": status.exit_code,
                "finished_step": finished["step"] if finished else None,
                "checkpoint": finished["checkpoint"] if finished else None,
                "log": str(provider.log_path(instance.instance_id)),
            }
        )
        if finished or status.state != "exited":
            break
    render(rows, fmt, title=f"{name}: placements")
    if not finished:
        raise ProviderError(
            f"job {name} did not finish (last state {rows[-1]['state']}); see {rows[-1]['log']}"
        )


def _options(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--storage-options: not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise InputError("--storage-options: must be a JSON object")
    return value


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _follow(provider: LocalProvider, instance_id: str) -> InstanceStatus:
    """Copy the job's log to stderr until it ends; Ctrl-C or a SIGTERM to this command (what
    ``kill``, systemd and container runtimes send) terminates the job: SIGTERM to it, so it
    checkpoints and stops. The job runs in a process group of its own, so without this a
    terminated command would leave it training."""
    log = provider.log_path(instance_id)
    offset = 0
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            status = provider.status(instance_id)
            offset = _copy(log, offset)
            if not status.state.is_live:
                _copy(log, offset)
                return status
            sleep(POLL_S)
    except KeyboardInterrupt:
        typer.echo("interrupted: asking the job to checkpoint and stop", err=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the stop short
        status = provider.terminate(instance_id)
        _copy(log, offset)
        return status
    finally:
        signal.signal(signal.SIGTERM, previous)


def _copy(log: Path, offset: int) -> int:
    if not log.exists():
        return offset
    with log.open("rb") as f:
        f.seek(offset)
        chunk = f.read()
    if chunk:
        sys.stderr.write(chunk.decode(errors="replace"))
        sys.stderr.flush()
    return offset + len(chunk)
