"""A cluster with etc_batch preloaded, for launches: background workers, their
supervisor and the launcher, through kills, crashes, restarts and a failover.

  workers   cluster `workers` on port 55490: shared_preload_libraries = 'etc_batch',
            max_worker_processes 16, etc_batch.max_workers 12, synchronous commit to
            its standby once one is attached; the test database has etc_batch installed
  standby   cluster `workers_standby` on port 55491, a streaming standby of it (the
            failover test starts it, and promotes it)

Each is started with scripts/lib.sh and stopped at the end of the module, whatever
happened.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import OwnCluster, lib, own_cluster, pg_bin  # noqa: E402

PORT = 55490
STANDBY_PORT = 55491
TEST_DB = "etc_batch_workers"
# PostgreSQL 15, Debian's: scripts/test runs this suite on 15 only
PG_BIN = pg_bin()


class Cluster(OwnCluster):
    """A cluster the suite restarts and crashes as a DBA's server would be."""

    def pg_ctl(self, *args, timeout=180):
        # as cluster_start starts it, with RUST_BACKTRACE set
        command = ["runuser", "-u", "postgres", "--", "env", "RUST_BACKTRACE=1", str(PG_BIN / "pg_ctl"),
                   "-D", str(self.data_dir), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, (args, done.stdout, done.stderr, self.server_log()[-3000:])
        return done

    def restart_immediately(self):
        """pg_ctl restart -m immediate: no shutdown checkpoint; the start runs crash
        recovery."""
        self.pg_ctl("-m", "immediate", "-w", "-l", str(self.socket_dir / "server.log"),
                    "restart")

    def wait_connectable(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.connect() as conn:
                    conn.execute("SELECT 1")
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@pytest.fixture(scope="module")
def workers():
    with own_cluster("workers", PORT, TEST_DB, "shared_preload_libraries = 'etc_batch'",
                     "max_worker_processes = 16", "etc_batch.max_workers = 12", "wal_level = replica",
                     "max_wal_senders = 5", "log_min_messages = warning", cluster=Cluster) as cluster:
        yield cluster


@pytest.fixture
def standby(workers):
    """A streaming standby of the workers' cluster, to which the primary commits
    synchronously: what a client was told is committed is on it."""
    done = lib("standby_start", "workers_standby", str(STANDBY_PORT), str(PORT),
               "wal_receiver_status_interval = 1s")
    try:
        assert done.returncode == 0, f"standby_start failed:\n{done.stdout}\n{done.stderr}"
        cluster = Cluster("workers_standby", STANDBY_PORT, TEST_DB)
        with workers.connect() as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'workers_standby'")
            conn.execute("SELECT pg_reload_conf()")
        yield cluster
    finally:
        lib("cluster_stop", "workers_standby")
