"""A Citus cluster of three PostgreSQL 15 servers on loopback: a coordinator and two
workers, with Citus built from the source in tests/citus/source (lib.sh's ensure_citus,
once per tree, into the tests' private copy of PostgreSQL).

  citus     the coordinator, cluster `citus_coord` on port 55520, with Citus and
            etc_batch preloaded (launches), and workers `citus_w1` and `citus_w2` on
            55521 and 55522 with Citus preloaded; all with max_prepared_transactions
            for Citus's two-phase commits. The test database has Citus in every node,
            the workers added to the coordinator, and etc_batch created on the
            coordinator, which Citus creates on the workers too.

Every server is started with scripts/lib.sh and stopped at the end of the module,
whatever happened. Tests make their own tables and stop and start servers; each leaves
every server running.
"""

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import OwnCluster, lib, pg_bin, wait_until  # noqa: E402

COORDINATOR_PORT = 55520
WORKER_PORTS = (55521, 55522)
TEST_DB = "etc_batch_citus"
SETTINGS = ("max_prepared_transactions = 50", "log_min_messages = warning",
            # Citus commits or rolls back what a crash left prepared every second, not
            # every minute: the tests wait for its recovery
            "citus.recover_2pc_interval = '1s'")
PG_BIN = pg_bin(15)


class Node(OwnCluster):
    """One server of the cluster, which a test may stop and start as a DBA's would be."""

    def pg_ctl(self, *args, timeout=180):
        command = ["runuser", "-u", "postgres", "--", "env", "RUST_BACKTRACE=1", str(PG_BIN / "pg_ctl"),
                   "-D", str(self.data_dir), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, (args, done.stdout, done.stderr, self.server_log()[-3000:])
        return done

    def stop(self, mode="immediate"):
        """pg_ctl stop: immediate by default, a server that dies with no shutdown."""
        self.pg_ctl("-m", mode, "-w", "stop")

    def start(self):
        self.pg_ctl("-w", "-l", str(self.socket_dir / "server.log"), "start")
        self.wait_connectable()

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

    def prepared(self):
        """The transactions prepared and neither committed nor rolled back here."""
        with self.connect("postgres") as conn:
            return [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


class Citus:
    """The coordinator and its workers."""

    def __init__(self):
        self.coordinator = Node("citus_coord", COORDINATOR_PORT, TEST_DB)
        self.workers = [Node(f"citus_w{i + 1}", port, TEST_DB) for i, port in enumerate(WORKER_PORTS)]

    @property
    def nodes(self):
        return [self.coordinator, *self.workers]

    def connect(self, **kwargs):
        return self.coordinator.connect(**kwargs)

    def worker_of(self, table, value):
        """The worker that holds the shard of `table` that `value` of its distribution
        column lies in."""
        with self.connect() as conn:
            port = conn.execute(
                "SELECT p.nodeport FROM pg_dist_shard_placement p "
                "WHERE p.shardid = get_shard_id_for_distribution_column(%s, %s)", (table, value)).fetchone()[0]
        return next(w for w in self.workers if w.port == port)

    def settled(self):
        """Waits until no node holds a prepared transaction (Citus's recovery finishes
        what a failure left), and returns them all, which is then none."""
        wait_until(lambda: not any(n.prepared() for n in self.nodes),
                   "every node's prepared transactions to be resolved", timeout=60)
        return {n.name: n.prepared() for n in self.nodes}


@pytest.fixture(scope="module")
def citus():
    built = lib("ensure_citus", timeout=1800)
    assert built.returncode == 0, f"ensure_citus failed:\n{built.stdout}\n{built.stderr}"
    cluster = Citus()
    started = []
    try:
        for node in cluster.nodes:
            preload = "citus, etc_batch" if node is cluster.coordinator else "citus"
            done = lib("cluster_start", node.name, str(node.port),
                       f"shared_preload_libraries = '{preload}'", *SETTINGS)
            started.append(node)
            assert done.returncode == 0, f"cluster_start {node.name} failed:\n{done.stdout}\n{done.stderr}"
        for node in cluster.nodes:
            with node.connect("postgres") as conn:
                conn.execute(f"CREATE DATABASE {TEST_DB}")
            with node.connect() as conn:
                conn.execute("CREATE EXTENSION citus")
        with cluster.connect() as conn:
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (COORDINATOR_PORT,))
            for port in WORKER_PORTS:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (port,))
            conn.execute("CREATE EXTENSION etc_batch")
        yield cluster
    finally:
        for node in started:
            lib("cluster_stop", node.name)


@contextlib.contextmanager
def table(citus, name, ddl, distribute=None, rows=None, shard_count=8):
    """A table made on the coordinator with `ddl`, distributed by `distribute` (a
    column; "reference" for a reference table; None: a local table) in `shard_count`
    shards, filled by `rows` (an INSERT), and dropped at the end."""
    with citus.connect() as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        conn.execute(ddl)
        if distribute == "reference":
            conn.execute("SELECT create_reference_table(%s)", (name,))
        elif distribute:
            conn.execute("SELECT create_distributed_table(%s, %s, shard_count => %s)",
                         (name, distribute, shard_count))
        if rows:
            conn.execute(rows)
    try:
        yield name
    finally:
        with citus.connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
