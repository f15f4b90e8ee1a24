"""``spotopt ui``: serve the read-only dashboard (``spotopt.ui``) until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spotopt.cli.common import state
from spotopt.errors import ConfigError, InputError
from spotopt.render import say
from spotopt.settings import Settings
from spotopt.webguard import is_loopback

MIN_TOKEN_CHARS = 16
"""A shorter ``SPOTOPT_UI_TOKEN`` is refused: the token is the dashboard's only lock beyond
this machine, and a short one is guessed (``openssl rand -hex 16`` gives 32 characters)."""


def ui(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to listen on; anything but loopback needs SPOTOPT_UI_TOKEN.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8787,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="The local provider's directory, as given to `spotopt daemon run`: a job's page shows "
            "the tail of its log from there.",
        ),
    ] = None,
) -> None:
    """Serve the read-only web dashboard: fleet, jobs, markets, availability, stored what-ifs.

    On loopback it needs no token, and answers only requests addressed to this machine; on any
    other address every request must carry SPOTOPT_UI_TOKEN (open the page once with
    ?token=TOKEN, or send Authorization: Bearer TOKEN).
    """
    from spotopt.cli.daemon import DEFAULT_STATE_DIR

    secret = Settings().ui_token
    token = secret.get_secret_value() if secret is not None and secret.get_secret_value() else None
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"SPOTOPT_UI_TOKEN: too short ({len(token)} of at least {MIN_TOKEN_CHARS} characters); "
            "set it to e.g. `openssl rand -hex 16`"
        )
    if token is None and not is_loopback(host):
        raise InputError(
            f"--host {host}: serving beyond this machine needs a token; set SPOTOPT_UI_TOKEN "
            "(e.g. to `openssl rand -hex 16`) or use --host 127.0.0.1"
        )
    try:
        import uvicorn

        from spotopt.ui.app import create_app
    except ImportError as exc:
        raise ConfigError(
            f"spotopt ui needs the ui extra ({exc.name} is missing): pip install 'spotopt-gpu[ui]'"
        ) from None
    app = create_app(state(ctx).db(), token, host=host, state_dir=state_dir or DEFAULT_STATE_DIR)
    say(f"dashboard at http://{host}:{port}/ (Ctrl-C stops it)", label="ui:", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
