"""The dashboard's web application: routes, the token check and the templates.

Read-only: every route is a GET that renders one page of ``spotopt.ui.views``. Jinja2 escapes
every value (autoescape on for all templates), so a job name or reason holding markup is shown
as text. Charts get their data as JSON inside a ``<script type="application/json">`` block
(``tojson`` escapes ``<``, ``>`` and ``&``), drawn by the vendored uPlot; htmx re-fetches the
fleet table every 30 s. Nothing is loaded from outside the package (``static/VENDORED.md``), and
nothing runs or is styled inline: the content security policy (``spotopt.webguard``) allows the
package's own scripts and stylesheets only, and no page may be framed.

Without a token the dashboard serves loopback only and answers only requests addressed to this
machine's names (``spotopt.webguard``: a page renamed to 127.0.0.1 is refused). With a token
(``SPOTOPT_UI_TOKEN``), every request must carry it: ``Authorization: Bearer TOKEN``, or the
cookie set after opening any page once with ``?token=TOKEN``.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from spotopt.db.engine import Database
from spotopt.errors import InputError
from spotopt.render import usd
from spotopt.ui import views
from spotopt.webguard import DASHBOARD_CSP, GuardASGI, loopback_hosts

COOKIE = "spotopt_ui_token"
STATIC = Path(__file__).parent / "static"


def when(value: datetime | None) -> str:
    """A time to the minute, UTC (the page says so once)."""
    return "–" if value is None else f"{value:%Y-%m-%d %H:%M}"


def number(value: float | None, digits: int = 3) -> str:
    """A plain number to ``digits`` significant digits (unknown: an en dash)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}g}"


def age(days: float | None) -> str:
    """A price's age: hours under two days (``5 h``), whole days beyond (``941 d``)."""
    if days is None or (isinstance(days, float) and math.isnan(days)):
        return "–"
    return f"{days * 24:.0f} h" if days < 2 else f"{days:,.0f} d"


def share(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0%}"


def cell(value: Any) -> str:
    """Any report value for a table cell: numbers by ``number``, times by ``when``, unknown as –."""
    if isinstance(value, bool) or not isinstance(value, (int, float, datetime)):
        return "–" if value is None else str(value)
    return when(value) if isinstance(value, datetime) else number(value)


def templates() -> Environment:
    env = Environment(
        loader=PackageLoader("spotopt.ui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.filters.update(usd=usd, when=when, number=number, share=share, cell=cell, age=age)
    return env


class TokenCheck(BaseHTTPMiddleware):
    """Refuses every request without the token (401); ``?token=`` sets a cookie and redirects to
    the same page without it, so the token does not stay in the address bar or the history."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token

    def _valid(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        query = request.query_params.get("token")
        if self._valid(query):
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            response = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            return response
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip() or None
        if self._valid(bearer) or self._valid(request.cookies.get(COOKIE)):
            return await call_next(request)
        return PlainTextResponse(
            "401: this dashboard needs its token: open it once with ?token=TOKEN "
            "or send Authorization: Bearer TOKEN\n",
            status_code=401,
        )


def create_app(
    db: Database,
    token: str | None = None,
    clock: Callable[[], datetime] | None = None,
    host: str = "127.0.0.1",
    state_dir: Path | None = None,
) -> Starlette:
    """The dashboard over ``db`` served on ``host``; ``token`` None serves without one (loopback
    only, see ``spotopt.cli.ui``), answering only to this machine's names; ``clock`` gives "now"
    (UTC) for spend and ETAs; ``state_dir`` is the local provider's, where a job's log is read."""
    env = templates()
    now = clock or (lambda: datetime.now(UTC))

    def page(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**context), status_code=status_code)

    def not_found(exc: InputError) -> HTMLResponse:
        return page("error.html", status_code=404, message=str(exc))

    def fleet(request: Request) -> HTMLResponse:
        return page("fleet.html", page_name="fleet", **views.fleet(db, now()))

    def fleet_table(request: Request) -> HTMLResponse:
        return page("_fleet_table.html", **views.fleet(db, now()))

    def job(request: Request) -> HTMLResponse:
        try:
            data = views.job(db, request.path_params["name"], now(), state_dir)
            return page("job.html", page_name="fleet", **data)
        except InputError as exc:
            return not_found(exc)

    def markets(request: Request) -> HTMLResponse:
        try:
            data = views.markets(db, request.query_params.get("gpu"), now())
        except InputError as exc:
            return not_found(exc)
        return page("markets.html", page_name="markets", **data)

    def availability(request: Request) -> HTMLResponse:
        return page("availability.html", page_name="availability", **views.availability(db, now()))

    def whatif_list(request: Request) -> HTMLResponse:
        return page("whatif_list.html", page_name="whatif", runs=views.whatif_runs(db))

    def whatif(request: Request) -> HTMLResponse:
        try:
            return page("whatif.html", page_name="whatif", **views.whatif(db, request.path_params["name"]))
        except InputError as exc:
            return not_found(exc)

    routes = [
        Route("/", fleet),
        Route("/fleet/table", fleet_table),
        Route("/jobs/{name:path}", job),
        Route("/markets", markets),
        Route("/availability", availability),
        Route("/whatif", whatif_list),
        Route("/whatif/{name:path}", whatif),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    # The guard outermost: a refused host or a 401 carries the security headers too.
    hosts = None if token else loopback_hosts(host)
    middleware = [Middleware(GuardASGI, hosts=hosts, csp=DASHBOARD_CSP)]
    if token:
        middleware.append(Middleware(TokenCheck, token=token))
    return Starlette(routes=routes, middleware=middleware)
