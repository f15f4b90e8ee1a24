"""Cloud resource names and label values derived deterministically from spotopt's own strings.

An instance's name is a function of the idempotency key alone, so a launch retried after a crash
(same key) asks the cloud for the same name and finds the instance instead of starting a second
one. The readable part (the key, slugged) helps an operator in the console; the hash suffix keeps
two keys that slug alike (``job/1`` and ``job-1``) or that are cut short apart.
"""

from __future__ import annotations

import hashlib
import re
import uuid

HASH_CHARS = 10
"""Hex digits of SHA-256 kept in names: 40 bits, no collision among a fleet's keys in practice."""
SPOTOPT_NAMESPACE = uuid.UUID("5b1c7a4e-4f0e-5d4a-9c39-7d1f0c6a2b11")
"""The uuid5 namespace of request ids derived from idempotency keys (any fixed UUID works)."""


def digest(text: str, chars: int = HASH_CHARS) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:chars]


def resource_name(key: str, max_len: int = 63, prefix: str = "spotopt-") -> str:
    """``prefix`` + slug of ``key`` + ``-`` + hash, within ``max_len``: lowercase letters, digits
    and hyphens, starting with a letter and ending with a letter or digit (RFC 1035, which also
    satisfies Azure's Linux VM and host names)."""
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    room = max_len - len(prefix) - HASH_CHARS - 1
    slug = slug[:room].rstrip("-")
    return f"{prefix}{slug}-{digest(key)}" if slug else f"{prefix}{digest(key)}"


def request_uuid(*parts: str) -> str:
    """A UUID that is the same for the same ``parts``: GCP's ``requestId`` for a retried call."""
    return str(uuid.uuid5(SPOTOPT_NAMESPACE, "\x1f".join(parts)))


def label_value(text: str, max_len: int = 63) -> str:
    """A GCP label value for ``text``: lowercase ``[a-z0-9_-]``, at most 63 characters.

    Unchanged when ``text`` already qualifies. Otherwise disallowed characters become ``_`` and a
    hash of the original is appended (shortening the rest), so two values that sanitise alike
    still differ. Labels only narrow a server-side filter; exact values live in metadata.
    """
    if re.fullmatch(rf"[a-z0-9_-]{{0,{max_len}}}", text):
        return text
    clean = re.sub(r"[^a-z0-9_-]", "_", text.lower())
    return f"{clean[: max_len - HASH_CHARS - 1]}-{digest(text)}"


def label_key(text: str) -> str:
    """A GCP label key: like a value, and starting with a lowercase letter."""
    value = label_value(text)
    return value if value[:1].isalpha() else label_value("k" + text)
