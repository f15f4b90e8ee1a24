"""``spotopt catalog``: the GPU instance types the history knows."""

from __future__ import annotations

from typing import Annotated

import typer

from spotopt.catalog import check_gpu_query, gpu_matches
from spotopt.cli.common import FormatOption, check_cloud, state
from spotopt.db.queries import instance_types
from spotopt.render import Format, render

app = typer.Typer(no_args_is_help=True, help="GPU instance types of AWS, GCP and Azure.")

COLUMNS = [
    "cloud",
    "instance_type",
    "gpu",
    "gpu_count",
    "gpu_memory_gib",
    "vcpus",
    "memory_gib",
    "retired",
    "origin",
]


@app.command("list")
def list_(
    ctx: typer.Context,
    cloud: Annotated[str | None, typer.Option(help="aws, gcp or azure.")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU model (V100-32GB) or family (V100).")] = None,
    include_retired: Annotated[
        bool, typer.Option("--retired/--no-retired", help="Show retired types.")
    ] = True,
    fmt: FormatOption = Format.TABLE,
) -> None:
    """List instance types with their GPUs (unknown-GPU types imported from dumps show as –)."""
    if cloud:
        check_cloud(cloud)
    if gpu:
        gpu = check_gpu_query(gpu)
    with state(ctx).db().session() as session:
        rows = [
            {
                "cloud": t.cloud,
                "instance_type": t.name,
                "gpu": t.gpu_model,
                "gpu_count": t.gpu_count,
                "gpu_memory_gib": t.gpu_memory_gib,
                "vcpus": t.vcpus,
                "memory_gib": t.memory_gib,
                "retired": t.retired,
                "origin": t.origin,
            }
            for t in instance_types(session, cloud)
            if (gpu is None or gpu_matches(gpu, t.gpu_model)) and (include_retired or not t.retired)
        ]
    render(rows, fmt, title="GPU instance types", columns=COLUMNS)
