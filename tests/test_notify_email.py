"""The e-mail sink against a real local SMTP server (aiosmtpd): STARTTLS with a certificate the
test signs, then login, then one message per event, on SQLite and PostgreSQL (issue 40)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import SecretStr
from sqlalchemy import select

from spotopt.db.engine import Database
from spotopt.db.models import NotifyDelivery
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.notify.sinks import Email
from tests.mover_rows import T0, seed_markets
from tests.servers import free_port
from tests.test_notify import _kinds, _submit, _walk

USER, PASSWORD = "ops", "smtp-pass-73b1"


def _certificate(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (the test's own CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "smtp.pem", tmp / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@dataclass
class Mailbox:
    messages: list[Message] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.original_content))
        return "250 OK"


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[tuple[Mailbox, int, Path]]:
    cert, key = _certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    box = Mailbox()

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = data.login.decode() == USER and data.password.decode() == PASSWORD
        if ok:
            box.logins.append(data.login.decode())
        return AuthResult(success=ok)

    port = free_port()
    controller = Controller(
        box,
        hostname="127.0.0.1",
        port=port,
        tls_context=context,
        require_starttls=True,
        authenticator=authenticate,
        auth_required=True,
    )
    controller.start()
    yield box, port, cert
    controller.stop()


def test_each_event_is_mailed_over_starttls_after_login(
    db: Database, tmp_path: Path, smtp: tuple[Mailbox, int, Path]
) -> None:
    box, port, cert = smtp
    seed_markets(db)
    _submit(db, tmp_path, "mailed")
    _walk(
        db,
        "mailed",
        ("launching", "start"),
        ("running", "start: up"),
        ("recovering", "lost: preempted"),
        ("running", "recovered"),
        ("done", "finished: the agent marked the job complete"),
    )
    sink = Email(
        "127.0.0.1",
        port,
        "spotopt@example.com",
        ("ml@example.com",),
        USER,
        SecretStr(PASSWORD),
        starttls=True,
        cafile=str(cert),
    )
    Daemon(db, None, DaemonSettings(sinks=(sink,)), clock=lambda: T0 + timedelta(days=1)).notify()
    assert [m["Subject"].split(":")[1].strip() for m in box.messages] == [
        f"{kind} mailed" for _job, kind in _kinds(db)
    ]
    bodies = [json.loads(m.get_payload()) for m in box.messages]
    assert [b["event"] for b in bodies] == ["job.started", "job.preempted", "job.recovered", "job.done"]
    assert all(
        m["To"] == "ml@example.com" and m["Message-ID"] == f"<{b['id']}@spotopt>"
        for m, b in zip(box.messages, bodies, strict=True)
    )
    assert box.logins == [USER] * len(bodies)


def test_a_wrong_password_is_a_failed_delivery_tried_again(
    db: Database, tmp_path: Path, smtp: tuple[Mailbox, int, Path]
) -> None:
    box, port, cert = smtp
    seed_markets(db)
    _submit(db, tmp_path, "x")
    _walk(db, "x", ("cancelled", "by hand"))
    sink = Email(
        "127.0.0.1", port, "s@example.com", ("o@example.com",), USER, SecretStr("wrong"), cafile=str(cert)
    )
    Daemon(db, None, DaemonSettings(sinks=(sink,)), clock=lambda: T0 + timedelta(days=1)).notify()
    assert box.messages == []
    with db.session() as session:
        [row] = session.scalars(select(NotifyDelivery))
        assert row.delivered_at is None and row.attempts == 1 and row.next_try_at is not None
        assert row.last_error is not None and row.last_error.startswith("the SMTP server")
