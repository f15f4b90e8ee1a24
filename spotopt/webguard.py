"""What every spotopt web server (``spotopt ui``, ``report browse``, the daemon's ``/metrics``)
refuses and sends, in one place, as ASGI and WSGI middleware.

**DNS rebinding.** A server on loopback without a token trusts that only this machine reaches
it. A web page the user opens can break that: its host name (``evil.example``) is re-pointed at
127.0.0.1, and the browser, which only compares names, lets the page read the dashboard as its
own origin. The request then carries ``Host: evil.example``; a loopback server that answers only
to its own names (``localhost``, 127.0.0.0/8, ``::1`` and the address it was bound to) refuses it.
A server with a token needs no such check: the rebinding page never holds the token or its
cookie. A server bound beyond loopback is reached under names this machine cannot know.

**Headers.** Every response says it may not be framed (``frame-ancestors 'none'`` and
``X-Frame-Options: DENY``: no clickjacking), and carries the server's content security policy.

Nothing of spotopt is imported here (a base module): the dashboard, Datasette and the metrics
exporter each wrap their own application with it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""The dashboard: its own scripts and stylesheets only (nothing inline, nothing from outside)."""
DATASETTE_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""Datasette's pages carry inline scripts and styles of their own; nothing from outside."""
PLAIN_CSP = "default-src 'none'; frame-ancestors 'none'"
"""A server of plain text (``/metrics``): nothing to load at all."""

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def loopback_hosts(bind_host: str) -> frozenset[str] | None:
    """The ``Host`` names a server bound to ``bind_host`` answers to: this machine's own
    names and ``bind_host``; None (any) for a server bound beyond loopback."""
    if not is_loopback(bind_host):
        return None
    return frozenset(_name(h) for h in (*LOOPBACK_NAMES, bind_host))


def _name(host: str) -> str:
    """A host as compared: lower case, no trailing dot, an IPv6 address without brackets."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port (``[::1]:8787`` is ``::1``)."""
    header = header.strip()
    if header.startswith("["):
        return _name(header.partition("]")[0])
    if header.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        header = header.partition(":")[0]
    return _name(header)


def host_allowed(header: str | None, hosts: frozenset[str] | None) -> bool:
    """Whether a request with this ``Host`` header (None: none sent) may be answered."""
    if hosts is None:
        return True
    return header is not None and host_name(header) in hosts


def refusal(header: str | None, hosts: frozenset[str]) -> str:
    """The body of the 400 answer to a refused ``Host``."""
    return (
        f"400: Host {header!r} is not this server's address; it answers on loopback only to "
        f"{', '.join(sorted(hosts))} (a page that renamed itself to reach it is refused)\n"
    )


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class GuardASGI:
    """ASGI middleware: refuses an HTTP request whose ``Host`` is not in ``hosts`` (None: any),
    with 400, and adds the security headers (``csp``) to every HTTP response."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None, csp: str) -> None:
        self.app = app
        self.hosts = hosts
        self.headers = [(k.lower().encode(), v.encode()) for k, v in security_headers(csp)]

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"host")
        header = None if given is None else given.decode("latin-1")
        if not host_allowed(header, self.hosts):
            assert self.hosts is not None
            body = refusal(header, self.hosts).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        *self.headers,
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def guard_wsgi(app: WSGIApp, hosts: frozenset[str] | None, csp: str) -> WSGIApp:
    """``GuardASGI`` for a WSGI application."""
    headers = security_headers(csp)

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = environ.get("HTTP_HOST")
        if not host_allowed(header, hosts):
            assert hosts is not None
            body = refusal(header, hosts).encode()
            start_response(
                "400 Bad Request",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))), *headers],
            )
            return [body]

        def start(status: str, response_headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            return start_response(status, [*response_headers, *headers], *exc_info)

        return app(environ, start)

    return guarded


def security_headers(csp: str) -> list[tuple[str, str]]:
    """The headers every response carries: the content security policy ``csp`` and no framing."""
    return [
        ("Content-Security-Policy", csp),
        ("X-Frame-Options", "DENY"),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
    ]
