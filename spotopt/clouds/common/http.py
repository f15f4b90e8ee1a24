"""Plain HTTPS GETs of public JSON documents (Spot Advisor, Azure Retail Prices): no credentials."""

from __future__ import annotations

from typing import Any

TIMEOUT_S = 60


class HttpJson:
    """A small wrapper over one ``requests.Session`` (imported on first use)."""

    def __init__(self) -> None:
        self._session: Any = None

    def get(self, url: str, params: dict[str, str] | None = None) -> tuple[Any, dict[str, str]]:
        """GET ``url`` and return (decoded JSON, response headers); HTTP errors raise
        ``requests.HTTPError`` (its ``response.status_code`` drives the retry rule)."""
        if self._session is None:
            import requests

            self._session = requests.Session()
            self._session.headers["User-Agent"] = "spotopt"
        response = self._session.get(url, params=params, timeout=TIMEOUT_S)
        response.raise_for_status()
        return response.json(), dict(response.headers)
