"""The notifications guide's signature check (docs/guides/notifications.md), run as written,
accepts the webhook's real signature and refuses a body changed by one byte."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from spotopt.notify.sinks import Webhook
from tests.notify_receiver import serve

GUIDE = Path(__file__).parents[1] / "docs" / "guides" / "notifications.md"


def test_the_guides_verification_accepts_a_real_signature_and_refuses_a_changed_body() -> None:
    [code] = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    namespace: dict[str, Any] = {}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    receiver, server = serve()
    try:
        Webhook(receiver.url, SecretStr("shared")).send(
            {"id": "e1", "event": "job.done", "job": "resnet", "at": "2026-03-02T14:00:00Z"}, 5.0
        )
    finally:
        server.shutdown()
    [request] = receiver.requests
    header = request.headers["X-Spotopt-Signature"]
    assert namespace["verified"]("shared", request.raw, header)
    assert not namespace["verified"]("shared", request.raw.replace(b"resnet", b"resnEt"), header)
    assert not namespace["verified"]("other", request.raw, header)
