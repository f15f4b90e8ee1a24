"""A real HTTP receiver on 127.0.0.1, in a thread the test owns, for the notification tests.

It records every request (headers and raw body) and answers ``status``; with ``hang`` set it
holds each request open until released (``arrived`` is set when one is held), which is how a
test SIGKILLs a daemon in the middle of a send without any timing. ``acknowledged`` is the ids
of the events it answered 2xx to: a receiver that drops repeats by id keeps one of each."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


@dataclass
class Receiver:
    url: str = ""
    status: int = 200
    hang: bool = False
    requests: list[Request] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]


def serve() -> tuple[Receiver, ThreadingHTTPServer]:
    """A started receiver and its server (``shutdown()`` it when done)."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            receiver.requests.append(Request(dict(self.headers.items()), raw))
            if receiver.hang:
                receiver.arrived.set()
                receiver.release.wait(60)
                return
            self.send_response(receiver.status)
            self.end_headers()
            if 200 <= receiver.status < 300:
                receiver.acknowledged.append(self.headers["X-Spotopt-Event-Id"])

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the test reads ``requests``, not a log."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver, server
