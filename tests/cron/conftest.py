"""A cluster of its own with pg_cron preloaded, for tests/cron.

pg_cron runs its jobs through libpq connections of its own; cron.host points them at
the cluster's socket directory, so they use the Unix socket (trust authentication)
rather than TCP. The cluster is started with scripts/lib.sh's cluster_start and stopped
again at the end of the module, whatever happened.
"""

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT, OwnCluster, lib  # noqa: E402

NAME = "cron"
PORT = 55443
SOCKET_DIR = ROOT / "target" / "pg" / NAME
TEST_DB = "etc_batch_cron"

# What the module measured, printed in pytest's terminal summary (visible with -q).
TIMINGS = {}


@pytest.fixture(scope="module")
def cron_cluster():
    """Cluster `cron` on port 55443 with pg_cron in the postgres database and a test
    database with etc_batch installed; stopped at the end."""
    started = time.monotonic()
    done = lib(
        "cluster_start",
        NAME,
        str(PORT),
        "shared_preload_libraries = 'pg_cron'",
        "cron.database_name = 'postgres'",
        f"cron.host = '{SOCKET_DIR}'",
        "cron.max_running_jobs = 16",
    )
    try:
        assert done.returncode == 0, f"cluster_start {NAME} failed:\n{done.stdout}\n{done.stderr}"
        socket = SOCKET_DIR / f".s.PGSQL.{PORT}"
        assert socket.exists(), f"no server socket at {socket}"
        cluster = OwnCluster(NAME, PORT, TEST_DB)
        with cluster.connect("postgres") as conn:
            conn.execute("CREATE EXTENSION pg_cron")
            conn.execute(f"CREATE DATABASE {TEST_DB}")
            host = conn.execute("SHOW cron.host").fetchone()[0]
            assert host == str(SOCKET_DIR)
            sockets = conn.execute("SHOW unix_socket_directories").fetchone()[0]
            assert sockets == str(SOCKET_DIR)
        with cluster.connect() as conn:
            conn.execute("CREATE EXTENSION etc_batch")
        TIMINGS["cluster start"] = time.monotonic() - started
        yield cluster
    finally:
        stopped = lib("cluster_stop", NAME)
        TIMINGS["module total"] = time.monotonic() - started
        if stopped.returncode != 0 and (SOCKET_DIR / "data" / "postmaster.pid").exists():
            raise AssertionError(f"cluster_stop {NAME} failed: {stopped.stderr}")


@pytest.fixture(scope="module")
def cron_timings():
    """Where a test module records what it measured, for the terminal summary."""
    return TIMINGS


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        parts = ", ".join(f"{what} {seconds:.1f}s" for what, seconds in TIMINGS.items())
        terminalreporter.write_line(f"tests/cron timings: {parts}")
