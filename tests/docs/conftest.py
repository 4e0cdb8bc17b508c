"""The documentation, checked against the installed extension and the tests' own output.

Runs against the cluster libpq finds through PGHOST and PGPORT (scripts/test exports
them), in a database of its own with etc_batch installed, dropped again at the end.
"""

import secrets
import sys
from pathlib import Path

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import require_connection_env  # noqa: E402


@pytest.fixture(scope="session")
def catalog():
    require_connection_env()
    name = f"etc_batch_docs_{secrets.token_hex(4)}"
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        try:
            with psycopg.connect(dbname=name, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION etc_batch")
                yield conn
        finally:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
