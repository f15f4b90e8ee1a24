"""The bundled catalog's sync into the SQL history (``spotopt.catalog`` is the lookup it reads).

The sync is idempotent and runs when the files' hash differs from the one stored in ``meta``.
"""

from __future__ import annotations

import hashlib
from importlib import resources

from sqlalchemy.orm import Session

from spotopt.catalog import CATALOG_SOURCE, instance_types, list_prices
from spotopt.db.models import Meta
from spotopt.history.ingest import Ingestor, upsert_instance_type

CATALOG_FILES = ("gpus.csv", "instance_types.csv", "list_prices.csv")


def catalog_hash() -> str:
    digest = hashlib.sha256()
    for name in CATALOG_FILES:
        digest.update(resources.files("spotopt.data").joinpath(name).read_bytes())
    return digest.hexdigest()[:16]


def sync_catalog(session: Session) -> bool:
    """Bring the bundled catalog into the database if it changed; True if anything was written."""
    wanted = catalog_hash()
    stored = session.get(Meta, "catalog_hash")
    if stored is not None and stored.value == wanted:
        return False
    for spec in instance_types():
        upsert_instance_type(session, spec, CATALOG_SOURCE)
    ingestor = Ingestor(session, CATALOG_SOURCE, run_id=None)
    for price in list_prices():
        ingestor.add(price)
    ingestor.flush()
    session.merge(Meta(key="catalog_hash", value=wanted))
    return True
