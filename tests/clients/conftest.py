"""Fixtures for the client matrix: psql and psycopg, straight to PostgreSQL and through
a real PgBouncer in transaction mode.

The PostgreSQL side and the PgBouncer are tests/pooler's fixtures, reused as they are:
that conftest is loaded here under a name of its own (every conftest.py outside a
package is a module called "conftest" otherwise) and its fixtures are re-exported.

  pg        a database of its own with etc_batch installed (pg.direct() connects to it)
  bouncer   PgBouncer in front of the cluster, transaction pooling, 3 server connections
  app_role  a LOGIN role that PgBouncer knows, dropped at the end
  client    parametrized over "direct" and "pgbouncer": connect() gives an autocommit
            psycopg connection by that route, psql_args() the psql options for it
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import pooler_fixtures  # noqa: E402

pooler = pooler_fixtures()

pg = pooler.pg
bouncer = pooler.bouncer
app_role = pooler.app_role
_close_bouncer_connections = pooler._close_bouncer_connections


class Route:
    """One way to reach the module's database: straight or through PgBouncer."""

    def __init__(self, name, pg, bouncer):
        self.name = name
        self.pg = pg
        self.bouncer = bouncer

    @property
    def pooled(self):
        return self.bouncer is not None

    def connect(self, **kwargs):
        """A psycopg connection, autocommit unless told otherwise; through PgBouncer
        with prepare_threshold=None (pooler.connect_bouncer)."""
        if self.bouncer is None:
            return self.pg.direct(**kwargs)
        return self.bouncer.connect(self.pg.name, **kwargs)

    def psql_args(self):
        if self.bouncer is None:
            return ["-h", "127.0.0.1", "-p", str(pooler.pg_port()), "-d", self.pg.name]
        return ["-h", "127.0.0.1", "-p", str(self.bouncer.port), "-d", self.pg.name]

    def __repr__(self):
        return self.name


@pytest.fixture(params=["direct", "pgbouncer"])
def client(request, pg):
    """The test runs once straight to PostgreSQL and once through PgBouncer."""
    if request.param == "direct":
        return Route("direct", pg, None)
    return Route("pgbouncer", pg, request.getfixturevalue("bouncer"))


@pytest.fixture
def direct(pg):
    return Route("direct", pg, None)


@pytest.fixture(autouse=True)
def _close_direct_connections(request):
    """Closes every direct connection a test opened (the module's admin connection
    stays), whatever the outcome of the test."""
    if "pg" not in request.fixturenames:
        yield
        return
    db = request.getfixturevalue("pg")
    mark = len(db._conns)
    yield
    for conn in db._conns[mark:]:
        try:
            conn.close()
        except Exception:
            pass
    del db._conns[mark:]
