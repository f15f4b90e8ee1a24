"""``spotopt ui``: serve the read-only dashboard (``spotopt.ui``) until Ctrl-C."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from spotopt.cli.common import state
from spotopt.errors import ConfigError, InputError
from spotopt.render import say
from spotopt.settings import Settings


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def ui(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to listen on; anything but loopback needs SPOTOPT_UI_TOKEN.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8787,
) -> None:
    """Serve the read-only web dashboard: fleet, jobs, markets, availability, stored what-ifs.

    On loopback it needs no token; on any other address every request must carry
    SPOTOPT_UI_TOKEN (open the page once with ?token=TOKEN, or send Authorization: Bearer TOKEN).
    """
    secret = Settings().ui_token
    token = secret.get_secret_value() if secret is not None and secret.get_secret_value() else None
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
    app = create_app(state(ctx).db(), token)
    say(f"dashboard at http://{host}:{port}/ (Ctrl-C stops it)", label="ui:", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
