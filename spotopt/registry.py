"""One registry for everything a user picks by name: collectors, policies, reports, strategies.

Each is registered under a kebab-case name that is also its CLI and config name. A ``Registry``
is a read-only mapping name → item (in registration order, for listings in the CLI and the
docs test); ``lookup`` is the user-facing access: an unknown name is an ``InputError`` that
suggests the closest name and lists the valid ones, worded the same for every kind of thing.

Registration happens where the item is defined (``@POLICIES.register("min-cost")``, or
``COLLECTORS.add(cls.name, cls)``). A registry whose items live in modules nobody imports yet
takes a ``load`` function that imports them; it runs once, on the first read, so importing the
registry stays cheap (no solver or SDK import just to parse ``--help``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from spotopt.errors import InputError

T = TypeVar("T")

KEBAB_CASE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def did_you_mean(name: str, valid: Sequence[str] | Mapping[str, Any]) -> str:
    """`` (did you mean 'x'?)`` for the closest valid name, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry(Mapping[str, T]):
    """Items of one ``kind`` by kebab-case name; ``plural`` words the listing in errors."""

    def __init__(self, kind: str, plural: str, load: Callable[[], object] | None = None) -> None:
        self.kind = kind
        self.plural = plural
        self._items: dict[str, T] = {}
        self._load = load

    def add(self, name: str, item: T) -> T:
        """Register ``item`` as ``name`` and return it. Registering the same item again is a
        no-op (a module imported twice); another item under a taken name is a programming error."""
        if not KEBAB_CASE.fullmatch(name):
            raise ValueError(f"{self.kind} name {name!r} is not kebab-case")
        if self._items.get(name, item) is not item:
            raise ValueError(f"two {self.plural} named {name!r}")
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of ``add``: ``@POLICIES.register("min-cost")``."""
        return lambda item: self.add(name, item)

    def lookup(self, name: str) -> T:
        """The item called ``name``; an unknown name raises ``InputError`` with a did-you-mean."""
        items = self._loaded()
        if name in items:
            return items[name]
        raise InputError(
            f"no {self.kind} {name!r}{did_you_mean(name, items)}; {self.plural}: {', '.join(self.names())}"
        )

    def names(self) -> list[str]:
        """Every registered name, sorted (for help texts and error messages)."""
        return sorted(self._loaded())

    def _loaded(self) -> dict[str, T]:
        if self._load is not None:
            self._load()
            self._load = None  # after success: a failed import is raised again, not hidden
        return self._items

    def __getitem__(self, name: str) -> T:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())
