"""A worker's network cut, for real: a Citus cluster of its own whose worker 2 lives in a
network namespace of its own, joined to the coordinator's by a veth pair the test takes
down and up again. Nothing is sent or answered while it is down, as when a cable is
pulled: no reset, no error, only silence.

  namespace etcb-cit-a   the coordinator (port 55550) and worker 1 (55551), at 10.214.1.1
  namespace etcb-cit-b   worker 2 (55552), at 10.214.1.2

The addresses exist only inside these namespaces, which are deleted at the end; the tests
reach every server through its Unix socket, which no cut reaches. The coordinator talks
to its workers with TCP keepalives (citus.node_conninfo), as a DBA sets them so that a
silent worker is found out in seconds rather than in the quarter of an hour TCP takes.

These tests make network namespaces: they run as root.
"""

import os
import subprocess
import threading
import time

import psycopg
import pytest
from conftest import PG_BIN, Node
from test_citus import ORDERS, exactly_once

from support import lib, wait_until

DB = "etc_batch_citus_net"
A, B = "etcb-cit-a", "etcb-cit-b"
A_ADDR, B_ADDR = "10.214.1.1", "10.214.1.2"
PORTS = {"citus_net0": 55550, "citus_net1": 55551, "citus_net2": 55552}
NAMESPACE = {"citus_net0": A, "citus_net1": A, "citus_net2": B}
SETTINGS = ("listen_addresses = '*'", "shared_preload_libraries = 'citus'",
            "max_prepared_transactions = 50", "log_min_messages = warning",
            "citus.recover_2pc_interval = '1s'",
            "citus.node_conninfo = 'sslmode=disable keepalives=1 keepalives_idle=1 "
            "keepalives_interval=1 keepalives_count=3 tcp_user_timeout=5000'")


def ip(*args, ns=None):
    prefix = ["ip", "netns", "exec", ns] if ns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True)


class NetNode(Node):
    """A server started inside its namespace."""

    def pg_ctl(self, *args, timeout=180):
        command = ["ip", "netns", "exec", NAMESPACE[self.name], "runuser", "-u", "postgres", "--",
                   str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, (args, done.stdout, done.stderr, self.server_log()[-3000:])
        return done

    def start(self):
        # pg_ctl -w waits until the server accepts connections
        self.pg_ctl("-w", "-l", str(self.socket_dir / "server.log"), "start")


class Cut:
    """The link between the two namespaces."""

    def down(self):
        ip("link", "set", "etcbcb", "down", ns=B)

    def up(self):
        ip("link", "set", "etcbcb", "up", ns=B)


@pytest.fixture(scope="module")
def net():
    if os.geteuid() != 0:
        pytest.fail("tests/citus's network tests make network namespaces: run them as root", pytrace=False)
    built = lib("ensure_citus", timeout=1800)
    assert built.returncode == 0, built.stderr
    nodes = {name: NetNode(name, port, DB) for name, port in PORTS.items()}
    started = []
    try:
        for ns in (A, B):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "netns", "add", ns], check=True)
            ip("link", "set", "lo", "up", ns=ns)
        ip("link", "add", "etcbca", "netns", A, "type", "veth", "peer", "name", "etcbcb", "netns", B)
        ip("addr", "add", f"{A_ADDR}/30", "dev", "etcbca", ns=A)
        ip("addr", "add", f"{B_ADDR}/30", "dev", "etcbcb", ns=B)
        ip("link", "set", "etcbca", "up", ns=A)
        ip("link", "set", "etcbcb", "up", ns=B)
        for name, node in nodes.items():
            done = lib("cluster_init", name, str(node.port), *SETTINGS)
            assert done.returncode == 0, done.stderr
            # the nodes reach each other over the link, trusted as on loopback
            with open(node.data_dir / "pg_hba.conf", "a") as hba:
                hba.write("host all all 10.214.1.0/30 trust\n")
            node.start()
            started.append(node)
        for node in nodes.values():
            with node.connect("postgres") as conn:
                conn.execute(f"CREATE DATABASE {DB}")
            with node.connect() as conn:
                conn.execute("CREATE EXTENSION citus")
        coordinator = nodes["citus_net0"]
        with coordinator.connect() as conn:
            conn.execute("SELECT citus_set_coordinator_host(%s, %s)", (A_ADDR, PORTS["citus_net0"]))
            conn.execute("SELECT citus_add_node(%s, %s)", (A_ADDR, PORTS["citus_net1"]))
            conn.execute("SELECT citus_add_node(%s, %s)", (B_ADDR, PORTS["citus_net2"]))
            conn.execute("CREATE EXTENSION etc_batch")
        yield coordinator, nodes["citus_net2"], list(nodes.values()), Cut()
    finally:
        for node in started:
            try:
                node.pg_ctl("-m", "immediate", "-w", "stop")
            except AssertionError:
                pass
        for ns in (A, B):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def settled(nodes):
    wait_until(lambda: not any(n.prepared() for n in nodes), "every node's prepared transactions resolved",
               timeout=90)


def on_worker_2(coordinator, table, customers):
    """Customers whose shard is on worker 2."""
    with coordinator.connect() as conn:
        return [r[0] for r in conn.execute(
            "SELECT c FROM generate_series(1, %s) c, pg_dist_shard_placement p "
            "WHERE p.shardid = get_shard_id_for_distribution_column(%s, c) AND p.nodeport = %s ORDER BY c",
            (customers, table, PORTS["citus_net2"]))]


def test_a_worker_cut_off_while_its_chunk_waits_there(net):
    """Worker 2's link goes down while a chunk's UPDATE waits there on a row lock: the
    coordinator hears nothing, its keepalives give the connection up in seconds, and
    the chunk rolls back; the drain ends with the error. The link comes back, the job is
    drained again to done: every row once, nothing prepared anywhere."""
    coordinator, worker, nodes, cut = net
    t = "orders_cut"
    with coordinator.connect() as conn:
        conn.execute(ORDERS.format(name=t))
        conn.execute("SELECT create_distributed_table(%s, 'customer', shard_count => 8)", (t,))
        conn.execute(f"INSERT INTO {t} (customer, id) SELECT c, i FROM generate_series(1, 40) c, "
                     "generate_series(1, 50) i")
        mine = on_worker_2(coordinator, t, 40)
        conn.execute("SELECT items FROM etc_batch.register_job_from_query('cut', NULL, %s::regclass, %s, 50, "
                     "'{\"status\": \"done\"}', tenant_column => NULL, "
                     "set_expressions => '{\"updates\": \"updates + 1\"}')",
                     (t, f"SELECT customer, id, revision FROM {t}"))
        first = conn.execute("SELECT (item_key::jsonb ->> 0)::int FROM etc_batch.job_item WHERE job_id = 'cut' "
                             "AND (item_key::jsonb ->> 0)::int = ANY(%s) ORDER BY position LIMIT 1",
                             (mine,)).fetchone()[0]
        shard = conn.execute("SELECT get_shard_id_for_distribution_column(%s, %s)", (t, first)).fetchone()[0]
    blocker = worker.connect(autocommit=False)
    blocker.execute(f"SELECT 1 FROM {t}_{shard} WHERE customer = %s AND id = 1 FOR UPDATE", (first,))
    outcome = {}

    def drain():
        try:
            with coordinator.connect() as c:
                c.execute("SET etc_batch.transient_attempts = 1")
                c.execute("CALL etc_batch.drain_job('cut')")
                outcome["ok"] = True
        except psycopg.Error as e:
            outcome["error"] = e

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    wait_until(lambda: worker.connect().execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"
    ).fetchone()[0] == 1, "the chunk's UPDATE waiting on worker 2")
    cut.down()
    try:
        thread.join(timeout=120)
        assert not thread.is_alive(), "the drain still waits on a worker that went silent"
        assert "error" in outcome, outcome
    finally:
        cut.up()
        blocker.close()
    settled(nodes)
    with coordinator.connect() as conn:
        for _ in range(5):
            try:
                conn.execute("CALL etc_batch.drain_job('cut')")
            except psycopg.Error:
                time.sleep(2)  # the worker's side of the cut connection ends when it hears of it
            if conn.execute("SELECT status FROM etc_batch.job WHERE job_id = 'cut'").fetchone() == ("done",):
                break
        exactly_once(conn, "cut", t, 2000)
        conn.execute(f"DROP TABLE {t}")
    settled(nodes)


def test_a_worker_cut_off_between_prepare_and_commit(net):
    """Worker 2 holds a chunk prepared, the coordinator's commit record written (held
    there by a synchronous standby that does not exist), when its link goes down: the
    coordinator's COMMIT PREPARED cannot reach it, and the call returns with the chunk
    committed on the coordinator. The link comes back, Citus's recovery commits the
    prepared part on worker 2: the chunk's rows changed once, the checkpoint past it."""
    coordinator, worker, nodes, cut = net
    t = "orders_cut2"
    with coordinator.connect() as conn:
        conn.execute(ORDERS.format(name=t))
        conn.execute("SELECT create_distributed_table(%s, 'customer', shard_count => 8)", (t,))
        conn.execute(f"INSERT INTO {t} (customer, id) SELECT c, i FROM generate_series(1, 40) c, "
                     "generate_series(1, 50) i")
        mine = on_worker_2(coordinator, t, 40)
        # a job of worker 2's customers only: its first chunk is prepared there
        conn.execute("SELECT items FROM etc_batch.register_job_from_query('cut2', NULL, %s::regclass, %s, 50, "
                     "'{\"status\": \"done\"}', tenant_column => NULL, "
                     "set_expressions => '{\"updates\": \"updates + 1\"}')",
                     (t, f"SELECT customer, id, revision FROM {t} WHERE customer = ANY('{{{','.join(map(str, mine))}}}')"))
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        conn.execute("SELECT pg_reload_conf()")
    drainer = coordinator.connect()
    pid = drainer.info.backend_pid
    thread = threading.Thread(target=lambda: drainer.execute("CALL etc_batch.drain_job('cut2', 1)"), daemon=True)
    try:
        thread.start()
        with coordinator.connect() as conn:
            wait_until(lambda: conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                            (pid,)).fetchone() == ("SyncRep",), "the chunk's commit in SyncRep")
        wait_until(lambda: worker.prepared(), "worker 2 holding the chunk prepared")
        cut.down()
    finally:
        with coordinator.connect() as conn:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")
    try:
        thread.join(timeout=120)
        assert not thread.is_alive(), "the call still waits on a worker that went silent"
        assert worker.prepared(), "the chunk's part on worker 2 was resolved with its link down"
    finally:
        cut.up()
    drainer.close()
    settled(nodes)
    with coordinator.connect() as conn:
        assert conn.execute("SELECT next_index FROM etc_batch.job WHERE job_id = 'cut2'").fetchone() == (50,)
        assert conn.execute(f"SELECT count(*) FROM {t} WHERE updates = 1").fetchone() == (50,)
        conn.execute("CALL etc_batch.drain_job('cut2')")
        n = len(mine) * 50
        assert conn.execute(f"SELECT updates, count(*) FROM {t} WHERE customer = ANY(%s) GROUP BY 1",
                            (mine,)).fetchall() == [(1, n)]
        assert conn.execute(f"SELECT count(*) FROM {t} WHERE updates <> 0 AND NOT customer = ANY(%s)",
                            (mine,)).fetchone() == (0,)
        assert all(r[1] for r in conn.execute("SELECT check_name, ok FROM etc_batch.verify_job('cut2')"))
        conn.execute(f"DROP TABLE {t}")
    settled(nodes)
