"""``spotopt prices``: the price history as stored, and the cheapest markets at a time.

``prices cheapest`` shows each price's age at the time asked for; a price older than the
setting ``price_max_age_days`` is stale and ranked after every fresh one, as ``report run
price-board`` ranks it: a market last priced in 2024 is not the cheapest now."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated

import typer

from spotopt.catalog import check_gpu_query
from spotopt.cli.common import MAX_ROWS, FormatOption, WideOption, check_cloud, parse_time, state
from spotopt.db.queries import MarketFilter, cheapest, history_span, iter_price_history
from spotopt.errors import InputError
from spotopt.render import Format, render, say
from spotopt.settings import Settings
from spotopt.types import MarketKind

app = typer.Typer(no_args_is_help=True, help="Prices in the history: as stored, or ranked at a time.")

TABLE_ROWS = 200
COLUMNS = [
    "observed_at",
    "cloud",
    "region",
    "zone",
    "instance_type",
    "market",
    "gpu",
    "gpu_count",
    "usd_per_hour",
    "usd_per_gpu_hour",
    "source",
]


def _market_kind(market: str | None) -> list[str] | None:
    if market is None:
        return None
    valid = [k.value for k in MarketKind]
    if market not in valid:
        raise InputError(f"--market {market!r} is not a market kind; use {' or '.join(valid)}")
    return [market]


@app.command()
def show(
    ctx: typer.Context,
    gpu: Annotated[str | None, typer.Option(help="GPU model (V100-32GB) or family (V100).")] = None,
    cloud: Annotated[str | None, typer.Option(help="aws, gcp or azure.")] = None,
    region: Annotated[str | None, typer.Option(help="Region, e.g. us-east-1.")] = None,
    instance_type: Annotated[str | None, typer.Option(help="Instance type, e.g. p3.2xlarge.")] = None,
    market: Annotated[str | None, typer.Option(help="spot or on-demand.")] = None,
    since: Annotated[str | None, typer.Option(help="ISO 8601 time, 'now' or -7d.")] = None,
    until: Annotated[str | None, typer.Option(help="ISO 8601 time, 'now' or -1d.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, max=MAX_ROWS, help="At most this many rows.")] = None,
    fmt: FormatOption = Format.TABLE,
    wide: WideOption = False,
) -> None:
    """Price points oldest first; with --since, the price in effect at that time comes first."""
    flt = MarketFilter(
        clouds=[check_cloud(cloud)] if cloud else None,
        regions=[region] if region else None,
        instance_types=[instance_type] if instance_type else None,
        kinds=_market_kind(market),
        gpu=check_gpu_query(gpu) if gpu else None,
        include_unknown_gpu=True,
    )
    start, end = parse_time(since, "--since"), parse_time(until, "--until")
    if start and end and start > end:
        raise InputError("--since is after --until; swap them")
    # A table is for reading: by default it shows TABLE_ROWS points and says whether more match.
    # CSV and JSON stream every point (millions) in constant memory.
    capped = fmt is Format.TABLE and limit is None
    with state(ctx).db().session() as session:
        quotes = iter_price_history(
            session, flt, since=start, until=end, limit=TABLE_ROWS + 1 if capped else limit
        )
        rows: Iterator[dict[str, object]] = (q.as_dict() for q in quotes)
        more, empty = False, None
        if capped:
            listed = list(rows)
            more, rows = len(listed) > TABLE_ROWS, iter(listed[:TABLE_ROWS])
            if not listed:
                span = history_span(session)
                covers = f"{span[0]:%Y-%m-%d} – {span[1]:%Y-%m-%d}" if span else "catalog list prices only"
                empty = f"no price point matches these filters and times; the history covers {covers}"
        render(
            rows,
            fmt,
            title="Price history (USD)",
            columns=COLUMNS,
            empty=empty,
            wide_only=("gpu", "gpu_count", "usd_per_gpu_hour", "source"),
            wide=wide,
        )
    if more:
        say(
            f"showing the first {TABLE_ROWS} price points and more match: --limit N shows more, "
            "--since/--until/--gpu/--cloud narrow them, --format csv writes them all",
            label="note:",
            style="dim",
            err=True,
        )


@app.command("cheapest")
def cheapest_cmd(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option(help="GPU model (V100-32GB) or family (V100).")],
    at: Annotated[str | None, typer.Option(help="ISO 8601 time (default now).")] = None,
    market: Annotated[str | None, typer.Option(help="spot or on-demand (default both).")] = None,
    cloud: Annotated[str | None, typer.Option(help="aws, gcp or azure.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_ROWS, help="How many markets.")] = 10,
    fmt: FormatOption = Format.TABLE,
    wide: WideOption = False,
) -> None:
    """Markets ranked by price per GPU-hour at a time, cheapest first."""
    when = parse_time(at, "--at") or datetime.now(UTC)
    flt = MarketFilter(
        clouds=[check_cloud(cloud)] if cloud else None,
        kinds=_market_kind(market),
        gpu=check_gpu_query(gpu),
    )
    max_age_days = Settings().price_max_age_days
    with state(ctx).db().session() as session:
        quotes = cheapest(session, when, flt)
    ages = {q.market_id: (when - q.observed_at).total_seconds() / 86_400 for q in quotes}
    ranked = sorted(quotes, key=lambda q: ages[q.market_id] > max_age_days)  # stable: fresh first
    rows = [
        q.as_dict() | {"age_days": ages[q.market_id], "stale": ages[q.market_id] > max_age_days}
        for q in ranked[:limit]
    ]
    render(
        rows,
        fmt,
        title=f"Cheapest {gpu} per GPU-hour at {when:%Y-%m-%d %H:%M} UTC",
        columns=[c for c in COLUMNS if c != "source"] + ["age_days", "stale", "source"],
        caption=f"stale: last priced more than {max_age_days:g} days before (setting price_max_age_days), "
        "ranked after the fresh",
        wide_only=("observed_at", "gpu", "usd_per_hour", "source"),
        wide=wide,
    )
