"""What every pytest suite of etc_batch shares: bounded waiting, scripts/lib.sh, and the
clusters a suite starts for itself.

Each suite's conftest.py puts this directory on sys.path and imports from here.
"""

import contextlib
import os
import subprocess
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]

# Upper bound for anything a test waits for (a backend to reach a point, a lock to be
# requested, a backend to exit). Generous, for slow machines; a test only ever waits
# this long when something is wrong.
WAIT = 20.0
POLL_INTERVAL = 0.05


def wait_until(predicate, what, timeout=WAIT, interval=POLL_INTERVAL):
    """Polls predicate() until it returns something truthy and returns that, or fails
    the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def size_from_env(name, default, least, kind=int):
    """A suite's size (rounds, seconds) from the environment variable `name`, `default`
    when unset. Below `least` a run could pass while proving nothing: refused, so that
    the suite fails at once instead of passing."""
    import pytest

    value = kind(os.environ.get(name) or default)
    if value < least:
        raise pytest.UsageError(f"{name}={os.environ.get(name)} is below {least}, the least that proves anything")
    return value


def require_connection_env():
    """Fails the test, without a traceback, unless libpq is pointed at a cluster."""
    import pytest

    missing = [v for v in ("PGHOST", "PGPORT") if not os.environ.get(v)]
    if missing:
        pytest.fail(
            "set PGHOST and PGPORT (and PGUSER, PGDATABASE) to the cluster under test; "
            f"missing: {', '.join(missing)}",
            pytrace=False,
        )


def close_quietly(conns):
    """Closes every connection in conns, whatever state each is in."""
    for conn in conns:
        try:
            conn.close()
        except Exception:  # a connection the server already ended
            pass


def lib(function, *args, timeout=180, major=None):
    """Runs a scripts/lib.sh function in a bash subshell of its own: lib.sh sets
    -euo pipefail, which must not reach the caller's shell. `major`: the PostgreSQL it
    works with (ETC_BATCH_PG), when not the one of the caller's environment."""
    env = None if major is None else {**os.environ, "ETC_BATCH_PG": str(major)}
    return subprocess.run(
        ["bash", "-c", f'source "$0"; {function} "$@"', str(ROOT / "scripts" / "lib.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def pg_bin(major=None):
    """The programs of PostgreSQL `major` (the environment's ETC_BATCH_PG if None) that the
    tests run, as lib.sh's PG_BIN names them: never the system's own installation."""
    done = lib("pg_bin", major=major, timeout=30)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


class OwnCluster:
    """A cluster a suite starts for itself with lib.sh's cluster_start: data directory,
    socket and server log under target/pg/<name>, the postgres superuser, trusted on
    the socket."""

    def __init__(self, name, port, test_db):
        self.name = name
        self.port = port
        self.test_db = test_db
        self.socket_dir = ROOT / "target" / "pg" / name
        self.data_dir = self.socket_dir / "data"

    def connect(self, dbname=None, **kwargs):
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 10)
        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, user="postgres",
            dbname=dbname or self.test_db, **kwargs
        )

    def server_log(self):
        try:
            return (self.socket_dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def own_cluster(name, port, test_db, *settings, cluster=OwnCluster):
    """Cluster `name` started on `port` with lib.sh's cluster_start and `settings`, its
    database `test_db` made with etc_batch installed; stopped on leaving, whatever
    happened. `cluster`: the OwnCluster class to hand out."""
    done = lib("cluster_start", name, str(port), *settings)
    try:
        assert done.returncode == 0, f"cluster_start {name} failed:\n{done.stdout}\n{done.stderr}"
        c = cluster(name, port, test_db)
        with c.connect("postgres") as conn:
            conn.execute(f"CREATE DATABASE {test_db}")
        with c.connect() as conn:
            conn.execute("CREATE EXTENSION etc_batch")
        yield c
    finally:
        lib("cluster_stop", name)


def pooler_fixtures():
    """tests/pooler's conftest, loaded once under a name of its own (every conftest.py
    outside a package is a module called "conftest" otherwise), for the suites that
    reuse its cluster and PgBouncer fixtures."""
    import importlib.util
    import sys

    name = "etc_batch_pooler_fixtures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "pooler" / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
