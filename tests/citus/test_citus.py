"""Jobs on a Citus cluster (conftest.py: a coordinator and two workers on loopback):
each chunk on one shard, committed with its audit and checkpoint in one two-phase
commit, every item changed exactly once.

Each table counts the updates every row received (`updates`, which the job adds one to
by set_expressions); the drains run with citus.log_remote_commands, whose NOTICEs say
which shards each chunk's statement went to and how Citus committed it.
"""

import os
import re
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest
from conftest import PG_BIN, table

from support import wait_until

ORDERS = ("CREATE TABLE {name} (customer int NOT NULL, id int NOT NULL, status text NOT NULL DEFAULT 'new', "
          "updates int NOT NULL DEFAULT 0, revision bigint NOT NULL DEFAULT 1, PRIMARY KEY (customer, id))")


def orders(citus, name, customers=40, per_customer=50, shard_count=8):
    return table(citus, name, ORDERS.format(name=name), distribute="customer", shard_count=shard_count,
                 rows=f"INSERT INTO {name} (customer, id) SELECT c, i FROM generate_series(1, {customers}) c, "
                      f"generate_series(1, {per_customer}) i")


def register(conn, job, target, chunk, items_query=None, **terms):
    items_query = items_query or f"SELECT customer, id, revision FROM {target}"
    named = "".join(f", {k} => %({k})s" for k in terms)
    return conn.execute(
        "SELECT items, chunks FROM etc_batch.register_job_from_query(%(job)s, NULL, %(target)s::regclass, "
        "%(q)s, %(chunk)s, '{\"status\": \"done\"}', tenant_column => NULL, "
        "set_expressions => '{\"updates\": \"updates + 1\"}'" + named + ")",
        {"job": job, "target": target, "q": items_query, "chunk": chunk, **terms}).fetchone()


class RemoteCommands:
    """A session of the coordinator that logs every command Citus sends to a worker, read
    back chunk by chunk: the shards each chunk's statement went to, and whether Citus
    prepared its transaction on the worker (two phases) or committed it in one."""

    def __init__(self, citus):
        self.conn = citus.connect()
        self.lines = []
        self.conn.add_notice_handler(lambda d: self.lines.append(d.message_primary or ""))
        self.conn.execute("SET citus.log_remote_commands = on")
        self.conn.execute("SET client_min_messages = log")

    def chunks(self):
        """For each chunk committed: (the shards its change went to, prepared, committed
        in one phase)."""
        chunks, shards, prepared, one_phase = [], set(), 0, 0
        for line in self.lines:
            if m := re.match(r"issuing (?:UPDATE|DELETE FROM) public\.\w+_(\d+) ", line):
                shards.add(int(m.group(1)))
            elif line.startswith("issuing PREPARE TRANSACTION"):
                prepared += 1
            elif line == "issuing COMMIT":
                one_phase += 1
            elif re.match(r"chunk \d+ of \d+ committed", line):
                chunks.append((shards, prepared, one_phase))
                shards, prepared, one_phase = set(), 0, 0
        self.lines.clear()
        return chunks

    def close(self):
        self.conn.close()


def drained(citus, job):
    """Drains `job` in a session that logs what Citus sends to the workers; returns the
    chunks it committed, as RemoteCommands.chunks reads them."""
    remote = RemoteCommands(citus)
    try:
        remote.conn.execute("CALL etc_batch.drain_job(%s)", (job,))
        return remote.chunks()
    finally:
        remote.close()


def shards_per_chunk(conn, job, target):
    """How many shards the items of each chunk of the job lie in, in chunk order, as
    Citus places their keys."""
    return [r[0] for r in conn.execute(
        "SELECT count(DISTINCT get_shard_id_for_distribution_column(%s, (i.item_key::jsonb ->> 0)::int)) "
        "FROM etc_batch.job_item i JOIN etc_batch.job j USING (job_id) WHERE i.job_id = %s "
        "GROUP BY i.position / j.chunk_size ORDER BY i.position / j.chunk_size", (target, job))]


def exactly_once(conn, job, target, rows):
    """Every row of the target updated once by the job, done, its audit and checkpoint
    verified."""
    assert conn.execute(f"SELECT updates, status, count(*) FROM {target} GROUP BY 1, 2").fetchall() == \
        [(1, "done", rows)]
    assert conn.execute("SELECT status FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone() == ("done",)
    failed = [r for r in conn.execute("SELECT check_name, ok, detail FROM etc_batch.verify_job(%s)", (job,))
              if not r[1]]
    assert failed == []
    assert conn.execute("SELECT count(*) FROM etc_batch.job_audit WHERE job_id = %s", (job,)).fetchone() == (rows,)


def test_chunks_lie_in_one_shard_each_committed_in_two_phases(citus):
    """Registration orders the items by shard, so that chunks of 50 over customers of 50
    rows each lie in one shard each; every chunk's UPDATE goes to its one shard, and its
    transaction is prepared there and committed in two phases with the audit and
    checkpoint on the coordinator."""
    with orders(citus, "orders_shard") as t, citus.connect() as conn:
        assert register(conn, "by-shard", t, 50) == (2000, 40)
        assert shards_per_chunk(conn, "by-shard", t) == [1] * 40
        # job_progress and the doctor count the chunks by the node of their shard, as
        # Citus places each chunk's one customer
        per_chunk = [r[0] for r in conn.execute(
            "SELECT p.nodeport FROM etc_batch.job_item i, pg_dist_shard_placement p "
            "WHERE i.job_id = 'by-shard' AND i.position %% 50 = 0 AND p.shardid = "
            "get_shard_id_for_distribution_column(%s, (i.item_key::jsonb ->> 0)::int) ORDER BY i.position", (t,))]

        def by_node(committed):
            return {f"127.0.0.1:{w.port}": {"chunks": per_chunk.count(w.port),
                                            "committed": per_chunk[:committed].count(w.port)}
                    for w in citus.workers}
        assert conn.execute("SELECT chunks_per_node FROM etc_batch.job_progress WHERE job_id = 'by-shard'"
                            ).fetchone()[0] == by_node(0)
        remote = RemoteCommands(citus)
        try:
            remote.conn.execute("CALL etc_batch.drain_job('by-shard', 10)")
            chunks = remote.chunks()
            expected = by_node(10)
            assert conn.execute("SELECT chunks_per_node FROM etc_batch.job_progress WHERE job_id = 'by-shard'"
                                ).fetchone()[0] == expected
            doctor = {r[0]: r[1:] for r in conn.execute("SELECT * FROM etc_batch.doctor()")}
            assert doctor["job by-shard by node"] == (
                "ok", "Chunks committed, by the node of their shard: " + ", ".join(
                    f"{n} {c['committed']} of {c['chunks']}" for n, c in sorted(expected.items())) + ".", None)
            for w in citus.workers:
                assert doctor[f"Citus worker 127.0.0.1:{w.port}"] == (
                    "ok", "max_prepared_transactions is 50: chunks and steps commit there in two phases.", None)
            remote.conn.execute("CALL etc_batch.drain_job('by-shard')")
            chunks += remote.chunks()
        finally:
            remote.close()
        assert len(chunks) == 40
        assert [len(shards) for shards, _, _ in chunks] == [1] * 40
        # one participant, prepared, never committed in one phase
        assert [(prepared, one_phase) for _, prepared, one_phase in chunks] == [(1, 0)] * 40
        # each shard's chunks come one after another: 8 runs, one per shard
        runs = [next(iter(s)) for s, _, _ in chunks]
        assert len([i for i in range(len(runs)) if i == 0 or runs[i] != runs[i - 1]]) == 8
        exactly_once(conn, "by-shard", t, 2000)
        assert citus.settled() == {n.name: [] for n in citus.nodes}


def test_a_chunk_spans_two_shards_only_where_one_ends(citus):
    """Chunks of 70 over shards of 250 items each: a chunk takes the end of one shard's
    items and the start of the next one's only at the 7 places where a shard ends inside
    it; every other chunk lies in one shard. Keys in key order would put every chunk in
    every shard."""
    with orders(citus, "orders_span") as t, citus.connect() as conn:
        assert register(conn, "spans", t, 70) == (2000, 29)
        spans = shards_per_chunk(conn, "spans", t)
        assert max(spans) == 2
        assert spans.count(2) <= 7
        conn.execute("CALL etc_batch.drain_job('spans')")
        exactly_once(conn, "spans", t, 2000)


def test_a_key_without_the_distribution_column_is_refused(citus):
    """Every unique index of a distributed table has its distribution column: a key
    without it names no one row, and chunks of it could not be placed in a shard."""
    with table(citus, "accounts_dist", "CREATE TABLE accounts_dist (region text NOT NULL, id int NOT NULL, "
               "status text, revision bigint DEFAULT 1, PRIMARY KEY (region, id))",
               distribute="region", rows="INSERT INTO accounts_dist VALUES ('eu', 1), ('us', 2)") as t, \
            citus.connect() as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            conn.execute("SELECT * FROM etc_batch.register_job('by-id', NULL, %s::regclass, '[{\"id\": 1, "
                         "\"revision\": 1}]', 10, '{\"status\": \"x\"}', key_column => 'id', "
                         "tenant_column => NULL)", (t,))
        assert refused.value.diag.message_primary == \
            'target "accounts_dist" is distributed by column "region", which is not in the job\'s key (id)'
        assert conn.execute("SELECT count(*) FROM etc_batch.job WHERE job_id = 'by-id'").fetchone() == (0,)


def test_a_job_of_one_tenant_on_a_table_distributed_by_tenant(citus):
    """A table distributed by its tenant column: a job of one tenant lies in that
    tenant's one shard, each chunk goes there, and other tenants' rows are untouched."""
    with table(citus, "tickets", "CREATE TABLE tickets (tenant int NOT NULL, id int NOT NULL, "
               "status text NOT NULL DEFAULT 'new', updates int NOT NULL DEFAULT 0, "
               "revision bigint NOT NULL DEFAULT 1, PRIMARY KEY (tenant, id))", distribute="tenant",
               rows="INSERT INTO tickets (tenant, id) SELECT t, i FROM generate_series(1, 4) t, "
                    "generate_series(1, 300) i") as t, citus.connect() as conn:
        assert conn.execute(
            "SELECT items FROM etc_batch.register_job_from_query('tenant-3', '3', 'tickets', "
            "'SELECT id, revision FROM tickets WHERE tenant = 3', 40, '{\"status\": \"done\"}', "
            "key_column => 'id', set_expressions => '{\"updates\": \"updates + 1\"}')").fetchone() == (300,)
        chunks = drained(citus, "tenant-3")
        shard = conn.execute("SELECT get_shard_id_for_distribution_column('tickets', 3)").fetchone()[0]
        assert [(shards, prepared, one_phase) for shards, prepared, one_phase in chunks] == \
            [({shard}, 1, 0)] * 8
        assert conn.execute(f"SELECT tenant, updates, status, count(*) FROM {t} GROUP BY 1, 2, 3 ORDER BY 1").fetchall() \
            == [(1, 0, "new", 300), (2, 0, "new", 300), (3, 1, "done", 300), (4, 0, "new", 300)]


@pytest.mark.parametrize("kind", ["reference", "local"])
def test_reference_and_local_tables_drain_as_any_table(citus, kind):
    """A reference table (a copy on every node, changed on all in one two-phase commit)
    and a table of the coordinator's own: their jobs run as on a server without Citus."""
    distribute = "reference" if kind == "reference" else None
    name = f"plans_{kind}"
    with table(citus, name, f"CREATE TABLE {name} (id int PRIMARY KEY, status text NOT NULL DEFAULT 'new', "
               "updates int NOT NULL DEFAULT 0, revision bigint NOT NULL DEFAULT 1)", distribute=distribute,
               rows=f"INSERT INTO {name} (id) SELECT generate_series(1, 500)") as t, citus.connect() as conn:
        assert conn.execute(
            "SELECT items, chunks FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, %s, 100, "
            "'{\"status\": \"done\"}', tenant_column => NULL, set_expressions => '{\"updates\": \"updates + 1\"}')",
            (kind, t, f"SELECT id, revision FROM {t}")).fetchone() == (500, 5)
        conn.execute("CALL etc_batch.drain_job(%s)", (kind,))
        exactly_once(conn, kind, t, 500)
        if kind == "reference":
            # the copy on each worker changed with the coordinator's: its shard there
            # holds every row, each updated once
            shard = conn.execute("SELECT shardid FROM pg_dist_shard WHERE logicalrelid = %s::regclass",
                                 (t,)).fetchone()[0]
            for worker in citus.workers:
                with worker.connect() as w:
                    assert w.execute(f"SELECT updates, status, count(*) FROM {t}_{shard} GROUP BY 1, 2"
                                     ).fetchall() == [(1, "done", 500)]
        assert citus.settled() == {n.name: [] for n in citus.nodes}


def test_two_drainers_of_a_parallel_job(citus):
    """A parallel approval drained by two sessions at once, each chunk claimed by one of
    them. The first holds chunk 1 (its UPDATE waits on a row lock on its worker) when the
    second looks for a chunk: it starts halfway down the frozen list, which holds one
    worker's shards after the other's, so on the other worker. Every row once."""
    with orders(citus, "orders_par", customers=80, per_customer=25) as t, citus.connect() as conn:
        assert register(conn, "par", t, 25, parallel=True) == (2000, 80)

        def worker_of_chunk(chunk):
            customer = conn.execute("SELECT (item_key::jsonb ->> 0)::int FROM etc_batch.job_item "
                                    "WHERE job_id = 'par' AND position = %s", ((chunk - 1) * 25,)).fetchone()[0]
            return citus.worker_of(t, customer), customer

        first_worker, customer = worker_of_chunk(1)
        shard = conn.execute("SELECT get_shard_id_for_distribution_column(%s, %s)", (t, customer)).fetchone()[0]
        blocker = first_worker.connect(autocommit=False)
        blocker.execute(f"SELECT 1 FROM {t}_{shard} WHERE customer = %s AND id = 1 FOR UPDATE", (customer,))
        errors = []

        def drain():
            try:
                with citus.connect() as c:
                    c.execute("CALL etc_batch.drain_job('par')")
            except Exception as e:  # reported below
                errors.append(e)

        first = threading.Thread(target=drain)
        first.start()
        try:
            wait_until(lambda: first_worker.connect().execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"
            ).fetchone()[0] == 1, "the first drainer's chunk 1 waiting on its worker")
            with citus.connect() as second:
                second.execute("CALL etc_batch.drain_job('par', 1)")
            taken = conn.execute("SELECT chunk FROM etc_batch.job_chunk WHERE job_id = 'par' AND committed"
                                 ).fetchall()
            assert len(taken) == 1 and taken[0][0] > 1, taken
            assert worker_of_chunk(taken[0][0])[0] is not first_worker
        finally:
            blocker.close()
        first.join(timeout=300)
        assert errors == []
        exactly_once(conn, "par", t, 2000)


def test_a_delete_on_a_distributed_table(citus):
    """A purge: each chunk's DELETE on its shard, the rows kept with the audit."""
    with orders(citus, "orders_purge", customers=16, per_customer=30) as t, citus.connect() as conn:
        assert conn.execute(
            "SELECT items FROM etc_batch.register_job_from_query('purge', NULL, %s::regclass, %s, 30, NULL, "
            "tenant_column => NULL, action => 'delete')",
            (t, f"SELECT customer, id, revision FROM {t} WHERE id <= 20")).fetchone() == (320,)
        chunks = drained(citus, "purge")
        assert len(chunks) == 11
        assert max(len(shards) for shards, _, _ in chunks) <= 2
        assert conn.execute(f"SELECT count(*), min(id) FROM {t}").fetchone() == (160, 21)
        assert conn.execute("SELECT status FROM etc_batch.job WHERE job_id = 'purge'").fetchone() == ("done",)
        assert all(r[1] for r in conn.execute("SELECT check_name, ok FROM etc_batch.verify_job('purge')"))
        assert citus.settled() == {n.name: [] for n in citus.nodes}


@pytest.mark.parametrize("archive", ["distributed", "local"])
def test_a_move_to_an_archive(citus, archive):
    """An archive move: each chunk's rows deleted from their shard and inserted into the
    archive (distributed the same way, or a table of the coordinator) in the chunk's one
    two-phase commit."""
    name = f"orders_arch_{archive}"
    with orders(citus, "orders_move", customers=16, per_customer=30) as t, \
            table(citus, name, ORDERS.format(name=name),
                  distribute="customer" if archive == "distributed" else None) as a, citus.connect() as conn:
        assert conn.execute(
            "SELECT items FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, %s, 30, NULL, "
            "tenant_column => NULL, action => 'move', archive => %s::regclass)",
            (f"move-{archive}", t, f"SELECT customer, id, revision FROM {t} WHERE id <= 20", a)).fetchone() == (320,)
        conn.execute("CALL etc_batch.drain_job(%s)", (f"move-{archive}",))
        assert conn.execute(f"SELECT count(*), min(id) FROM {t}").fetchone() == (160, 21)
        assert conn.execute(f"SELECT count(*), count(DISTINCT (customer, id)), max(id) FROM {a}").fetchone() == \
            (320, 320, 20)
        assert conn.execute("SELECT status FROM etc_batch.job WHERE job_id = %s", (f"move-{archive}",)).fetchone() \
            == ("done",)
        assert all(r[1] for r in conn.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)",
                                              (f"move-{archive}",)))
        assert citus.settled() == {n.name: [] for n in citus.nodes}


def test_a_drain_waits_for_a_slot_nobody_reads_on_a_worker(citus):
    """pace_job's max_replica_lag_bytes on a coordinator is read on every worker too: a
    physical replication slot nobody reads, on worker 2, holding back more WAL than
    that, holds the drain before its first chunk (job_progress says why); once the slot
    is dropped the drain goes on to done."""
    worker = citus.workers[1]
    with orders(citus, "orders_lag") as t, citus.connect() as conn:
        register(conn, "lag", t, 50)
        conn.execute("SELECT etc_batch.pace_job('lag', max_replica_lag_bytes => 1024)")
        with worker.connect() as w:
            w.execute("SELECT pg_create_physical_replication_slot('unread', true)")
            w.execute("CREATE TABLE wal_after_the_slot AS SELECT generate_series(1, 1000) g")
        try:
            drainer = citus.connect()
            pid = drainer.info.backend_pid
            thread = threading.Thread(target=lambda: drainer.execute("CALL etc_batch.drain_job('lag')"),
                                      daemon=True)
            thread.start()

            def waiting():
                row = conn.execute("SELECT waiting FROM etc_batch.job_progress WHERE job_id = 'lag'").fetchone()
                return row and row[0]
            reason = wait_until(waiting, "the drain to wait for the worker's slot")
            assert re.fullmatch(r'job "lag": waiting for the replicas, \d+ bytes behind, more than 1024', reason), \
                reason
            assert conn.execute("SELECT next_index FROM etc_batch.job WHERE job_id = 'lag'").fetchone() == (0,)
            assert "waiting for the replicas" in conn.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]
        finally:
            with worker.connect() as w:
                w.execute("SELECT pg_drop_replication_slot('unread')")
                w.execute("DROP TABLE IF EXISTS wal_after_the_slot")
        thread.join(timeout=120)
        assert not thread.is_alive()
        drainer.close()
        exactly_once(conn, "lag", t, 2000)


def test_what_the_documentation_shows(citus):
    """docs.sql, run by psql on the coordinator at etc_batch's default settings, prints
    expected/citus.out, which docs/citus.md quotes: a job's chunks by shard and by node,
    the doctor, a key refused, the job done and nothing left prepared."""
    here = Path(__file__).parent
    shown = subprocess.run(
        [str(PG_BIN / "psql"), "-X", "-a", "-h", str(citus.coordinator.socket_dir), "-p",
         str(citus.coordinator.port), "-U", "postgres", "-d", citus.coordinator.test_db,
         "-f", "docs.sql"], cwd=here,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        env={**os.environ, "PGOPTIONS": "-c etc_batch.progress_interval=1s"})
    # errors and notices as a terminal shows them, each after the statement that raised it
    assert shown.returncode == 0, shown.stdout
    assert shown.stdout == (here / "expected" / "citus.out").read_text()


def test_a_key_of_one_column_distributed_by_itself(citus):
    """A table keyed and distributed by id: each chunk's items are ids of one shard (a
    value of its own each), and its UPDATE goes to that shard alone."""
    with table(citus, "accounts_by_id", "CREATE TABLE accounts_by_id (id bigint PRIMARY KEY, "
               "status text NOT NULL DEFAULT 'new', updates int NOT NULL DEFAULT 0, "
               "revision bigint NOT NULL DEFAULT 1)", distribute="id",
               rows="INSERT INTO accounts_by_id (id) SELECT generate_series(1, 1600)") as t, citus.connect() as conn:
        assert conn.execute(
            "SELECT items, chunks FROM etc_batch.register_job_from_query('by-id', NULL, %s::regclass, %s, 100, "
            "'{\"status\": \"done\"}', tenant_column => NULL, set_expressions => '{\"updates\": \"updates + 1\"}')",
            (t, f"SELECT id, revision FROM {t}")).fetchone() == (1600, 16)
        chunks = drained(citus, "by-id")
        assert len(chunks) == 16
        # 200 ids a shard, or so: chunks of 100 lie in one shard but where one ends
        assert max(len(shards) for shards, _, _ in chunks) <= 2
        assert sum(len(shards) == 1 for shards, _, _ in chunks) >= 16 - 7
        # every chunk prepared on its worker (or on both, for one across them), none
        # committed in one phase
        assert all(prepared >= 1 and one_phase == 0 for _, prepared, one_phase in chunks), chunks
        exactly_once(conn, "by-id", t, 1600)
        assert citus.settled() == {n.name: [] for n in citus.nodes}
