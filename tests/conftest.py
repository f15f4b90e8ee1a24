"""Database fixtures: every database test runs on SQLite and on a real PostgreSQL server.

Schemas are built through the Alembic migrations (never ``create_all``), once per session into a
template (a SQLite file, a PostgreSQL template database) that each test copies, so every test
starts from a fresh, migrated database with the bundled catalog synced.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from sqlalchemy import create_engine, text

from spotopt.db.engine import Database
from spotopt.history.setup import open_history, upgrade_history
from tests.pg import PostgresServer, find_bindir
from tests.zygote import Zygote

BACKENDS = ("sqlite", "postgresql")

# Hypothesis: CI replays the same examples on every run (``derandomize``), so a rare draw cannot
# fail one build by chance and a failure reproduces from its log; locally the exploring profile
# draws new examples each run and keeps failing ones in ``.hypothesis/`` to retry first.
# ``HYPOTHESIS_PROFILE`` overrides the choice (e.g. ``HYPOTHESIS_PROFILE=ci`` to replay CI's draws).
# Loaded here, before any test module: per-test ``@settings`` inherit the loaded profile.
# Both start from Hypothesis' defaults: with ``CI`` set, Hypothesis has already made its own
# built-in "ci" profile the default, which the exploring profile must not inherit.
settings.register_profile(
    "ci", settings.get_profile("default"), derandomize=True, database=None, print_blob=True
)
settings.register_profile("explore", settings.get_profile("default"))
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE")
    or ("ci" if os.environ.get("CI", "").lower() == "true" else "explore")
)
_counter = itertools.count()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the user's real database or settings."""
    for key in list(os.environ):
        if key.startswith("SPOTOPT_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SPOTOPT_DB_URL", f"sqlite:///{tmp_path / 'default.sqlite'}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but no PostgreSQL binaries: .ci/run must install postgresql")
        pytest.skip("no PostgreSQL binaries (pg_ctl) on this machine; install postgresql to run these")
    server = PostgresServer(bindir)
    server.start()
    with create_engine(server.url(), isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text("CREATE DATABASE spotopt_template"))
    upgrade_history(server.url("spotopt_template"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.sqlite"
    upgrade_history(f"sqlite:///{path}")
    return path


def _pg_database(server: PostgresServer) -> str:
    name = f"t{os.getpid()}_{next(_counter)}"
    with create_engine(server.url(), isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE spotopt_template"))
    return server.url(name)


def _fresh_url(request: pytest.FixtureRequest, directory: Path) -> str:
    """A fresh migrated database of the backend ``request.param`` (SQLite: in ``directory``)."""
    if request.param == "sqlite":
        path = directory / "history.sqlite"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    return _pg_database(request.getfixturevalue("pg_server"))


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a fresh migrated database, once per backend."""
    return _fresh_url(request, tmp_path)


@pytest.fixture(scope="module", params=BACKENDS)
def module_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of a fresh migrated database per backend, shared by one module's tests: for tests
    that fill it once and read it through something slow to start (a server, a browser)."""
    return _fresh_url(request, tmp_path_factory.mktemp("module-db"))


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = open_history(db_url)
    yield database
    database.dispose()


@pytest.fixture
def sqlite_db(sqlite_template: Path, tmp_path: Path) -> Iterator[Database]:
    """SQLite only, for tests about SQLite-specific behaviour."""
    path = tmp_path / "only.sqlite"
    shutil.copy(sqlite_template, path)
    database = open_history(f"sqlite:///{path}")
    yield database
    database.dispose()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """A fresh migrated PostgreSQL database, for tests that compare the two backends."""
    return _pg_database(pg_server)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block every connection that leaves the machine; loopback and Unix sockets stay allowed.

    A stray real cloud call then fails loudly instead of passing on a developer's laptop.
    """
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> object:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = str(address[0]) if isinstance(address, tuple) else str(address)
            if host not in ("localhost", "::1") and not host.startswith("127."):
                raise OSError(f"network access blocked in tests: {address!r}")
        return real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture(scope="module")
def zygote_preload() -> tuple[Path | str, ...]:
    """The scripts and modules a module's ``zygote`` preloads; none: no zygote. A test module
    whose jobs are forked from one (the trainer tests) overrides this fixture."""
    return ()


@pytest.fixture(scope="module")
def zygote(
    zygote_preload: tuple[Path | str, ...], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Zygote | None]:
    """The module's forking launcher (``tests/zygote.py``), stopped after its last test."""
    if not zygote_preload:
        yield None
        return
    made = Zygote.start(zygote_preload, tmp_path_factory.mktemp("zygote") / "output")
    yield made
    made.stop()


SLOW_TEARDOWN_S = 2.0
"""A test's teardown slower than this is reported in the warnings summary, with when each of its
fixtures finished: CI spends 8-17 s in some of ``tests/test_zygote.py``'s teardowns where they
take 0.02 s here, and neither its zygote's stop nor its provider's terminations is the cause."""
_finalized: list[tuple[str, float]] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _finalized.clear()
    began = time.monotonic()
    try:
        return (yield)
    finally:
        took = time.monotonic() - began
        if took > SLOW_TEARDOWN_S:
            steps = ", ".join(f"{name} done at {at - began:.1f} s" for name, at in _finalized)
            warnings.warn(f"teardown took {took:.1f} s ({steps or 'no fixture finalized'})", stacklevel=1)


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    _finalized.append((fixturedef.argname, time.monotonic()))
