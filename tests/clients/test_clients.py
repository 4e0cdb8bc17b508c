"""The client matrix: psql and psycopg 3, straight to PostgreSQL and through a real
PgBouncer in transaction mode, each calling the whole of etc_batch's SQL surface.

Also what a client sees in the cases that depend on the client: autocommit off
(SQLSTATE 2D000 with a hint naming the driver setting), client_min_messages and the
per-chunk / per-step NOTICEs, cancellation (pg_cancel_backend, the client's own
statement_timeout, a cancel request sent through PgBouncer), and a PL/pgSQL
orchestrator procedure that CALLs the runners with COMMIT between them.

Every test uses names of its own (token suffixes), so the parametrized runs of a test
and the tests of the module never see each other's steps, jobs or leases.
"""

import json
import re
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from psycopg import errors, sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import WAIT, wait_until  # noqa: E402





def tag(label):
    return f"{label}_{secrets.token_hex(3)}"


# the module's tables ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tables(pg):
    """side: one row per executed step command; knob: a divisor per chain (a step that
    divides by it fails while it is 0); orchestrated: what an orchestrator got back."""
    pg.admin.execute(
        """CREATE TABLE side (
               batch text    NOT NULL,
               step  integer NOT NULL,
               pid   integer NOT NULL DEFAULT pg_backend_pid())"""
    )
    pg.admin.execute("CREATE TABLE knob (name text PRIMARY KEY, divisor integer NOT NULL)")
    pg.admin.execute(
        """CREATE TABLE orchestrated (
               job    text, chunks integer, items bigint, first_key text, last_key text,
               status text,
               at     timestamptz NOT NULL DEFAULT clock_timestamp())"""
    )
    return pg


class Orders:
    """orders_<tag>(tenant, id, revision, status) with ids 1..n of tenant X at
    revision 1, pending."""

    def __init__(self, pg, label, n):
        self.pg = pg
        self.name = tag(f"orders_{label}")
        self.ident = sql.Identifier(self.name)
        self.n = n
        pg.admin.execute(
            sql.SQL(
                "CREATE TABLE {} (tenant text NOT NULL, id integer NOT NULL, "
                "revision integer NOT NULL DEFAULT 1, status text NOT NULL DEFAULT 'pending', "
                "PRIMARY KEY (tenant, id))"
            ).format(self.ident)
        )
        pg.admin.execute(
            sql.SQL("INSERT INTO {} (tenant, id) SELECT 'X', g FROM generate_series(1, %s) g").format(
                self.ident
            ),
            (n,),
        )

    def items(self, ids=None):
        return [{"id": i, "revision": 1} for i in (ids or range(1, self.n + 1))]

    def rows(self):
        return {
            r[0]: (r[1], r[2])
            for r in self.pg.admin.execute(
                sql.SQL("SELECT id, revision, status FROM {} WHERE tenant = 'X'").format(self.ident)
            )
        }

    def handler(self, lock_key, from_id):
        """A handler that cancels an order, and first waits for advisory lock lock_key
        (transaction-scoped) for every id >= from_id."""
        fn = tag("cancel_order")
        self.pg.admin.execute(
            sql.SQL(
                """CREATE FUNCTION {fn}(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
                   DECLARE r jsonb;
                   BEGIN
                     IF (item->>'id')::int >= {from_id} THEN
                       PERFORM pg_advisory_xact_lock({key});
                     END IF;
                     UPDATE {t} SET status = 'cancelled', revision = revision + 1
                      WHERE tenant = item->>'tenant' AND id = (item->>'id')::int
                        AND revision = (item->>'revision')::int
                     RETURNING to_jsonb({t}.*) INTO r;
                     RETURN r;
                   END $$"""
            ).format(
                fn=sql.Identifier(fn),
                t=self.ident,
                key=sql.Literal(lock_key),
                from_id=sql.Literal(from_id),
            )
        )
        return f"{fn}(jsonb)"


def register(conn, job, orders, chunk_size, ids=None, handler=None):
    if handler is None:
        return conn.execute(
            "SELECT job_id, created, items, chunks FROM etc_batch.register_job("
            "%s, 'X', %s::regclass, %s::jsonb, %s, %s::jsonb, %s::jsonb)",
            (job, orders.name, json.dumps(orders.items(ids)), chunk_size,
             json.dumps({"status": "cancelled"}), json.dumps({"status": "pending"})),
        ).fetchone()
    return conn.execute(
        "SELECT job_id, created, items, chunks FROM etc_batch.register_job("
        "%s, 'X', %s::regclass, %s::jsonb, %s, NULL, handler => %s::regprocedure)",
        (job, orders.name, json.dumps(orders.items(ids)), chunk_size, handler),
    ).fetchone()


def add_side_chain(conn, batch, count):
    return [
        conn.execute(
            "SELECT etc_batch.add_step(%s, format('INSERT INTO side (batch, step) VALUES (%%L, %%s)', %s::text, %s))",
            (batch, batch, k),
        ).fetchone()[0]
        for k in range(1, count + 1)
    ]


def side_counts(pg, batch):
    return dict(
        pg.admin.execute(
            "SELECT step, count(*) FROM side WHERE batch = %s GROUP BY step", (batch,)
        ).fetchall()
    )


def step_states(pg, batch):
    return [
        tuple(r)
        for r in pg.admin.execute(
            "SELECT id, status, attempts FROM etc_batch.batch_log WHERE batch = %s ORDER BY id",
            (batch,),
        )
    ]


def job_state(pg, job):
    return tuple(
        pg.admin.execute(
            "SELECT status, next_index, chunks_committed FROM etc_batch.job WHERE job_id = %s",
            (job,),
        ).fetchone()
    )


def audit_by_key(pg, job):
    return Counter(
        {
            int(k): n
            for k, n in pg.admin.execute(
                "SELECT item_key, count(*) FROM etc_batch.job_audit_items WHERE job_id = %s GROUP BY item_key",
                (job,),
            )
        }
    )


def keys_text(ids):
    return [str(i) for i in ids]


class Notices:
    """Collects the primary message of every notice sent to a connection."""

    def __init__(self, conn):
        self.messages = []
        conn.add_notice_handler(self)

    def __call__(self, diag):
        self.messages.append(diag.message_primary or "")

    def matching(self, pattern):
        return [m for m in self.messages if re.search(pattern, m)]

    def clear(self):
        self.messages.clear()


# 1. psql ------------------------------------------------------------------------------------

PSQL_SCRIPT = r"""
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
\echo marker=start
SELECT etc_batch.add_step(:'chain', format('INSERT INTO side (batch, step) VALUES (%L, 1)', :'chain')) AS s1 \gset
SELECT etc_batch.add_step(:'chain', format('INSERT INTO side (batch, step) VALUES (%L, 2)', :'chain')) AS s2 \gset
SELECT etc_batch.add_step(:'failing', format('SELECT 1 / divisor FROM knob WHERE name = %L', :'failing')) AS f1 \gset
SELECT etc_batch.add_step(:'failing', format('INSERT INTO side (batch, step) VALUES (%L, 2)', :'failing')) AS f2 \gset
CALL etc_batch.exec_batch_from_id(:s1);
\set ON_ERROR_STOP 0
CALL etc_batch.exec_batch_from_id(:f1);
\set ON_ERROR_STOP 1
\echo failed_sqlstate=:LAST_ERROR_SQLSTATE
SELECT 'failing_status=' || status FROM etc_batch.batch_log WHERE id = :f1;
UPDATE knob SET divisor = 1 WHERE name = :'failing';
SELECT etc_batch.retry_step(:f1);
SELECT 'after_retry=' || status FROM etc_batch.batch_log WHERE id = :f1;
CALL etc_batch.exec_batch_from_id(:f1);
SELECT 'failing_done=' || count(*) FILTER (WHERE status = 'done') FROM etc_batch.batch_log WHERE batch = :'failing';
SELECT 'reset=' || etc_batch.reset_batch(:'chain');
CALL etc_batch.exec_batch_from_id(:s1);
SELECT 'chain_effects=' || count(*) FROM side WHERE batch = :'chain';
SELECT 'registered=' || created || ',' || items || ',' || chunks
  FROM etc_batch.register_job(:'job', 'X', :'orders',
       (SELECT jsonb_agg(jsonb_build_object('id', g, 'revision', 1)) FROM generate_series(1, 5) g),
       2, '{"status": "cancelled"}', '{"status": "pending"}');
CALL etc_batch.drain_job(:'job');
CALL etc_batch.drain_job(:'job');
SELECT 'report=' || string_agg(item_key || ':' || state, ',' ORDER BY position) FROM etc_batch.job_report(:'job');
SELECT 'summary=' || concat_ws(',', status, approved, committed, unprocessed, matching, drifted, missing)
  FROM etc_batch.job_summary(:'job');
SELECT 'verify=' || bool_and(ok) || ',' || count(*) FROM etc_batch.verify_job(:'job');
SELECT 'registered2=' || created FROM etc_batch.register_job(:'job2', 'X', :'orders',
       '[{"id": 6, "revision": 1}]', 1, '{"status": "cancelled"}');
SELECT etc_batch.abort_job(:'job2', 'the customer changed their mind');
SELECT 'aborted=' || status FROM etc_batch.job WHERE job_id = :'job2';
SELECT acquired, generation FROM etc_batch.acquire_lease(:'lease', 'psql', '1 minute') \gset lease_
\echo lease=:lease_acquired,:lease_generation
SELECT etc_batch.check_lease(:'lease', 'psql', :lease_generation);
\echo check_lease=ok
SELECT 'released=' || etc_batch.release_lease(:'lease', 'psql');
SELECT 'lock_key=' || etc_batch.lock_key('ns', :'chain');
BEGIN;
SELECT 'try_xact_lock=' || etc_batch.try_xact_lock('ns', :'chain');
SELECT etc_batch.xact_lock('ns', :'job');
SELECT 'locks_in_tx=' || count(*) FROM etc_batch.locks
 WHERE pid = pg_backend_pid() AND kind = 'advisory'
   AND stands_for IN ('advisory key ' || etc_batch.lock_key('ns', :'chain'),
                      'advisory key ' || etc_batch.lock_key('ns', :'job'));
COMMIT;
SELECT 'locks_after=' || count(*) FROM etc_batch.locks
 WHERE stands_for IN ('advisory key ' || etc_batch.lock_key('ns', :'chain'),
                      'advisory key ' || etc_batch.lock_key('ns', :'job'));
SELECT 'doctor=' || count(*) || ',' || count(*) FILTER (WHERE status = 'fail')
       || ',' || count(*) FILTER (WHERE check_name IN ('session advisory locks', 'extension version')
                                   AND status = 'ok')
  FROM etc_batch.doctor();
SELECT 'job_progress=' || concat_ws(',', status, committed, approved, chunks_committed, chunks_total)
  FROM etc_batch.job_progress WHERE job_id = :'job';
SELECT 'chain_progress=' || concat_ws(',', steps, done, failed, pending)
  FROM etc_batch.chain_progress WHERE batch = :'chain';
SELECT 'leases=' || concat_ws(',', holder, generation, expired) FROM etc_batch.leases WHERE name = :'lease';
\echo marker=end
"""


def run_psql(route, script, variables, tmp_path):
    path = tmp_path / "script.sql"
    path.write_text(script)
    args = ["psql", "-X", "-v", "ON_ERROR_STOP=1", *route.psql_args(), "-U", "postgres"]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    args += ["-f", str(path)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PGCONNECT_TIMEOUT": "10"})


def test_psql_calls_every_procedure_and_function(client, tables, tmp_path):
    pg = client.pg
    orders = Orders(pg, "psql", 6)
    names = {
        "chain": tag("psql_chain"),
        "failing": tag("psql_failing"),
        "job": tag("psql_job"),
        "job2": tag("psql_job2"),
        "lease": tag("psql_lease"),
        "orders": orders.name,
    }
    pg.admin.execute("INSERT INTO knob VALUES (%s, 0)", (names["failing"],))

    done = run_psql(client, PSQL_SCRIPT, names, tmp_path)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, f"psql exited with {done.returncode}\n{out}\n{err}"
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    chain, failing, job = names["chain"], names["failing"], names["job"]

    assert values["marker"] == "end"
    assert values["failed_sqlstate"] == "22012"
    assert values["failing_status"] == "failed"
    assert values["after_retry"] == "pending"
    assert values["failing_done"] == "2"
    assert values["reset"] == "2"
    assert values["chain_effects"] == "4"  # two runs of two steps, with reset_batch between
    assert values["registered"] == "true,5,3"
    # the two CALLs' result rows: the first drained everything, the second found it done
    assert "3|5|1|5|done" in out.splitlines()
    assert "0|0|||done" in out.splitlines()
    assert values["report"] == "1:matching,2:matching,3:matching,4:matching,5:matching"
    assert values["summary"] == "done,5,5,0,5,0,0"
    assert values["verify"] == "true,6"
    assert values["registered2"] == "true"
    assert values["aborted"] == "aborted"
    assert values["lease"] == "t,1"
    assert values["check_lease"] == "ok"
    assert values["released"] == "true"
    assert re.fullmatch(r"-?\d+", values["lock_key"])
    assert values["try_xact_lock"] == "true"
    assert values["locks_in_tx"] == "2"
    assert values["locks_after"] == "0"
    # the work above leaves nothing the doctor must fail, and no session lock behind
    doctor_total, doctor_failed, doctor_pinned_ok = map(int, values["doctor"].split(","))
    assert doctor_total > 0 and doctor_failed == 0 and doctor_pinned_ok == 2, values["doctor"]
    assert values["job_progress"] == "done,5,5,3,3"
    assert values["chain_progress"] == "2,2,0,0"
    assert values["leases"] == "psql,1,t"

    # the NOTICEs and the step's own error, on stderr
    for k in (1, 2, 3):
        assert f"chunk {k} of 3 committed" in err, err
    assert "chunk 1 of 3 committed: 2 items, keys 1 to 2" in err
    assert err.count(f'of batch "{chain}" committed') == 4, err
    assert f'of batch "{failing}" committed' in err
    assert "ERROR:  division by zero" in err
    assert err.count("ERROR:") == 1, err

    # and the database agrees
    assert side_counts(pg, chain) == {1: 2, 2: 2}
    assert side_counts(pg, failing) == {2: 1}
    assert orders.rows() == {**{i: (2, "cancelled") for i in range(1, 6)}, 6: (1, "pending")}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 6)})


# 2. psycopg ---------------------------------------------------------------------------------


def test_psycopg_calls_every_procedure_and_function(client, tables):
    pg = client.pg
    conn = client.connect()
    assert conn.autocommit
    if client.pooled:
        assert conn.prepare_threshold is None
    notices = Notices(conn)
    orders = Orders(pg, "psycopg", 6)
    chain, failing = tag("pg3_chain"), tag("pg3_failing")
    job, job2, lease = tag("pg3_job"), tag("pg3_job2"), tag("pg3_lease")
    pg.admin.execute("INSERT INTO knob VALUES (%s, 0)", (failing,))

    # chains
    s1, s2 = add_side_chain(conn, chain, 2)
    f1 = conn.execute(
        "SELECT etc_batch.add_step(%s, format('SELECT 1 / divisor FROM knob WHERE name = %%L', %s::text))",
        (failing, failing),
    ).fetchone()[0]
    conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (s1,))
    assert notices.messages == [
        f'step {s1} of batch "{chain}" committed',
        f'step {s2} of batch "{chain}" committed',
    ]
    with pytest.raises(errors.DivisionByZero) as failed:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (f1,))
    assert failed.value.sqlstate == "22012"
    assert f"Step {f1} of batch" in failed.value.diag.message_detail
    with pytest.raises(errors.ObjectNotInPrerequisiteState) as stopped:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (f1,))
    assert stopped.value.diag.message_primary == f'step {f1} of batch "{failing}" has failed'
    pg.admin.execute("UPDATE knob SET divisor = 1 WHERE name = %s", (failing,))
    conn.execute("SELECT etc_batch.retry_step(%s)", (f1,))
    assert step_states(pg, failing) == [(f1, "pending", 1)]
    notices.clear()
    conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (f1,))
    assert notices.messages == [f'step {f1} of batch "{failing}" committed']
    assert step_states(pg, failing) == [(f1, "done", 2)]
    assert conn.execute("SELECT etc_batch.reset_batch(%s)", (chain,)).fetchone() == (2,)
    notices.clear()
    conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (s1,))
    assert len(notices.matching(r"committed$")) == 2
    assert side_counts(pg, chain) == {1: 2, 2: 2}

    # jobs
    assert register(conn, job, orders, 2, ids=range(1, 6)) == (job, True, 5, 3)
    notices.clear()
    assert conn.execute("CALL etc_batch.drain_job(%s, 2)", (job,)).fetchone() == (
        2, 4, "1", "4", "pending")
    assert notices.messages == [
        "chunk 1 of 3 committed: 2 items, keys 1 to 2",
        "chunk 2 of 3 committed: 2 items, keys 3 to 4",
    ]
    assert conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone() == (1, 1, "5", "5", "done")
    assert conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone() == (0, 0, None, None, "done")
    report = conn.execute("SELECT * FROM etc_batch.job_report(%s)", (job,)).fetchall()
    assert [(r[1], r[2], r[3], r[4]) for r in report] == [
        (str(i), "matching", 2, 2) for i in range(1, 6)
    ]
    assert conn.execute("SELECT * FROM etc_batch.job_summary(%s)", (job,)).fetchone() == (
        "done", 5, 5, 0, 5, 0, 0, False, 0, None, None, None)
    checks = conn.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert checks and all(ok for _name, ok in checks), checks
    assert register(conn, job2, orders, 1, ids=[6]) == (job2, True, 1, 1)
    conn.execute("SELECT etc_batch.abort_job(%s, 'changed their mind')", (job2,))
    with pytest.raises(errors.ObjectNotInPrerequisiteState):
        conn.execute("CALL etc_batch.drain_job(%s)", (job2,))
    assert job_state(pg, job2) == ("aborted", 0, 0)

    # leases: the same statement many times (through PgBouncer: never prepared)
    rows = [
        conn.execute("SELECT * FROM etc_batch.acquire_lease(%s, 'pg3', '1 minute')", (lease,)).fetchone()
        for _ in range(10)
    ]
    assert all(r[0] and r[1] == "pg3" and r[2] == 1 for r in rows), rows
    for _ in range(6):
        conn.execute("SELECT etc_batch.check_lease(%s, 'pg3', 1)", (lease,))
    with pytest.raises(errors.InvalidTransactionInitiation):
        conn.execute("SELECT etc_batch.check_lease(%s, 'pg3', 2)", (lease,))
    assert conn.execute("SELECT etc_batch.release_lease(%s, 'pg3')", (lease,)).fetchone() == (True,)
    assert conn.execute(
        "SELECT holder, generation, expired FROM etc_batch.leases WHERE name = %s", (lease,)
    ).fetchone() == ("pg3", 1, True)

    # locks: transaction-scoped, inside one transaction block
    key = conn.execute("SELECT etc_batch.lock_key('ns', %s)", (chain,)).fetchone()[0]
    assert isinstance(key, int)
    with conn.transaction():
        assert conn.execute("SELECT etc_batch.try_xact_lock('ns', %s)", (chain,)).fetchone() == (True,)
        conn.execute("SELECT etc_batch.xact_lock('ns', %s)", (job,))
        held = conn.execute(
            "SELECT stands_for FROM etc_batch.locks WHERE pid = pg_backend_pid() AND kind = 'advisory'"
        ).fetchall()
        assert (f"advisory key {key}",) in held and len(held) == 2, held
    assert conn.execute(
        "SELECT count(*) FROM etc_batch.locks WHERE stands_for = %s", (f"advisory key {key}",)
    ).fetchone() == (0,)

    # the doctor and the views
    doctor = conn.execute("SELECT check_name, status FROM etc_batch.doctor()").fetchall()
    assert doctor and [n for n, s in doctor if s == "fail"] == [], doctor
    assert dict(doctor)["extension version"] == "ok"
    assert dict(doctor)["session advisory locks"] == "ok"
    assert conn.execute(
        "SELECT status, committed, approved, drainer_pid FROM etc_batch.job_progress WHERE job_id = %s",
        (job,),
    ).fetchone() == ("done", 5, 5, None)
    assert conn.execute(
        "SELECT steps, done, failed, pending, current_pid FROM etc_batch.chain_progress WHERE batch = %s",
        (chain,),
    ).fetchone() == (2, 2, 0, 0, None)
    # the transaction-scoped locks above ended with their transactions
    assert conn.execute(
        "SELECT count(*) FROM etc_batch.locks WHERE pid = pg_backend_pid() AND kind = 'advisory'"
    ).fetchone() == (0,)

    assert orders.rows() == {**{i: (2, "cancelled") for i in range(1, 6)}, 6: (1, "pending")}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 6)})


def test_many_executions_through_pgbouncer_need_no_prepared_statements(pg, bouncer, tables):
    """psycopg prepares a statement server-side on its 5th execution; PgBouncer 1.18 in
    transaction mode cannot follow that from one server connection to the next. With
    prepare_threshold=None every execution stays unprepared, whichever server
    connection it lands on."""
    lease = tag("loop_lease")
    conns = [bouncer.connect(pg.name) for _ in range(4)]  # more clients than server connections
    for conn in conns:
        assert conn.prepare_threshold is None
    generations = []
    for i in range(10):
        for conn in conns:
            row = conn.execute(
                "SELECT * FROM etc_batch.acquire_lease(%s, %s, '1 minute')", (lease, "loop")
            ).fetchone()
            generations.append(row[2])
            assert row[0] and row[1] == "loop"
    assert set(generations) == {1}
    orders = Orders(pg, "loop", 12)
    job = tag("loop_job")
    register(conns[0], job, orders, 1, ids=range(1, 13))
    results = [conns[i % 4].execute("CALL etc_batch.drain_job(%s, 1)", (job,)).fetchone()
               for i in range(12)]
    assert [r[:4] for r in results] == [(1, 1, str(i), str(i)) for i in range(1, 13)]
    assert results[-1][4] == "done"
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 13)})
    assert "prepared statement" not in bouncer.log()


def test_parallel_job_drained_by_many_clients_through_pgbouncer(pg, bouncer, tables):
    """Six clients share PgBouncer's three server connections in transaction mode and
    call drain_job on one parallel job until it is done: each chunk is claimed by one
    call, held by nothing a pooled session remembers, and committed once."""
    orders = Orders(pg, "pooled_parallel", 600)
    job = tag("pooled_parallel")
    row = bouncer.connect(pg.name).execute(
        "SELECT job_id, created, items, chunks FROM etc_batch.register_job("
        "%s, 'X', %s::regclass, %s::jsonb, 10, %s::jsonb, %s::jsonb, parallel => true)",
        (job, orders.name, json.dumps(orders.items(None)),
         json.dumps({"status": "cancelled"}), json.dumps({"status": "pending"})),
    ).fetchone()
    assert row == (job, True, 600, 60)
    results, failures = [], []

    def client():
        try:
            conn = bouncer.connect(pg.name)
            for _ in range(200):
                r = conn.execute("CALL etc_batch.drain_job(%s, 3)", (job,)).fetchone()
                results.append(r)
                if r[4] == "done":
                    return
        except BaseException as exc:  # kept for the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    assert failures == []
    assert sum(r[0] for r in results) == 60
    assert sum(r[1] for r in results) == 600
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 601)}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 601)})
    checks = pg.admin.execute("SELECT ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert checks and all(c[0] for c in checks), checks


def wait_launch(pg, launch_id, timeout=120):
    """Waits for a launch and its workers' runs to end; its status."""
    deadline = time.monotonic() + timeout
    while True:
        status, open_runs = pg.admin.execute(
            "SELECT l.status, EXISTS (SELECT FROM etc_batch.launch_run r WHERE r.launch_id = l.launch_id "
            "AND r.ended_at IS NULL AND r.pid IN (SELECT pid FROM pg_stat_activity)) "
            "FROM etc_batch.launch l WHERE l.launch_id = %s", (launch_id,)).fetchone()
        if status != "running" and not open_runs:
            return status
        assert time.monotonic() < deadline, f"launch {launch_id} did not end"
        time.sleep(0.1)


def test_a_launch_through_pgbouncer_in_transaction_mode(pg, bouncer, tables):
    """launch_job is a function, so a client behind a transaction-mode pooler launches
    work as it would any statement, and disconnects: the workers drain the job."""
    orders = Orders(pg, "pooled_launch", 600)
    job = tag("pooled_launch")
    conn = bouncer.connect(pg.name)
    conn.execute(
        "SELECT etc_batch.register_job(%s, 'X', %s::regclass, %s::jsonb, 50, %s::jsonb, "
        "parallel => true)",
        (job, orders.name, json.dumps(orders.items(None)), json.dumps({"status": "cancelled"})))
    launch_id, workers, pids = conn.execute(
        "SELECT launch_id, workers, pids FROM etc_batch.launch_job(%s, 2)", (job,)).fetchone()
    assert workers == 2 and len(pids) == 2
    conn.close()
    assert wait_launch(pg, launch_id) == "done"
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 601)}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 601)})


def test_the_doctor_names_a_launch_nobody_resumes_and_resume_launches_resumes_it(pg, tables):
    """Without the library preloaded, a launch's worker and its database's supervisor
    terminated, as a restart of the server would end them: nobody starts them again, and
    the doctor fails the launch; resume_launches starts the worker and the supervisor
    again, and the job finishes."""
    orders = Orders(pg, "orphaned_launch", 400)
    job = tag("orphaned_launch")
    conn = pg.direct()
    conn.execute(
        "SELECT etc_batch.register_job(%s, 'X', %s::regclass, %s::jsonb, 20, %s::jsonb)",
        (job, orders.name, json.dumps(orders.items(None)), json.dumps({"status": "cancelled"})))
    slow = sql.Identifier(f"{orders.name}_slow")
    pg.admin.execute(sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                             "$$ BEGIN PERFORM pg_sleep(0.1); RETURN NULL; END $$").format(slow))
    pg.admin.execute(sql.SQL("CREATE TRIGGER slow AFTER UPDATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}()")
                     .format(orders.ident, slow))
    launch_id = conn.execute("SELECT launch_id FROM etc_batch.launch_job(%s)", (job,)).fetchone()[0]
    # older than a launch whose first worker may still be starting, which the doctor spares
    pg.admin.execute("UPDATE etc_batch.launch SET launched_at = launched_at - interval '1 minute' "
                     "WHERE launch_id = %s", (launch_id,))
    wait_until(lambda: pg.admin.execute("SELECT committed FROM etc_batch.job_progress WHERE job_id = %s",
                                        (job,)).fetchone()[0] > 0, "the worker to commit a chunk")
    pg.admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE backend_type IN ('etc_batch worker', 'etc_batch supervisor') "
                     "AND datname = current_database()")
    wait_until(lambda: pg.admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('etc_batch worker', "
        "'etc_batch supervisor') AND datname = current_database()").fetchone()[0] == 0,
        "the worker and the supervisor to end")
    doctor = pg.admin.execute("SELECT status, detail, hint FROM etc_batch.doctor() WHERE check_name = %s",
                              (f"launch {launch_id}",)).fetchall()
    assert [d[0] for d in doctor] == ["fail"], doctor
    assert "0 of the 1 workers" in doctor[0][1] and "no supervisor runs" in doctor[0][1]
    assert "etc_batch.resume_launches()" in doctor[0][2]
    time.sleep(1)
    assert pg.admin.execute("SELECT status FROM etc_batch.launch WHERE launch_id = %s",
                            (launch_id,)).fetchone()[0] == "running"
    assert pg.admin.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'etc_batch worker' "
                            "AND datname = current_database()").fetchone()[0] == 0
    resumed = pg.admin.execute("SELECT launch_id, worker FROM etc_batch.resume_launches()").fetchall()
    assert resumed == [(launch_id, 1)]
    assert wait_launch(pg, launch_id) == "done"
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 401)}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 401)})
    assert pg.admin.execute("SELECT count(*) FROM etc_batch.doctor() WHERE check_name = %s",
                            (f"launch {launch_id}",)).fetchone()[0] == 0
    # with no launch running, as a schedule finds it most minutes: nothing is started
    supervisors = ("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'etc_batch supervisor' "
                   "AND datname = current_database()")
    wait_until(lambda: pg.admin.execute(supervisors).fetchone()[0] == 0, "the idle supervisor to end")
    assert pg.admin.execute("SELECT count(*) FROM etc_batch.launch WHERE status = 'running'").fetchone()[0] == 0
    assert pg.admin.execute("SELECT * FROM etc_batch.resume_launches()").fetchall() == []
    time.sleep(0.5)
    assert pg.admin.execute(supervisors).fetchone()[0] == 0


def test_pause_and_resume_from_another_client(client, tables):
    """A drain at work, paused from another connection (directly or through PgBouncer):
    it stops after the chunk in flight and returns normally with status paused; a call
    on the paused job returns at once; resumed, the next call finishes it, each order
    changed once."""
    pg = client.pg
    orders = Orders(pg, "paused", 40)
    job = tag("paused")
    fn = sql.Identifier(f"{job}_slow")
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END $$").format(fn=fn))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER slow AFTER UPDATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION {fn}()"
    ).format(t=orders.ident, fn=fn))
    drainer, operator = client.connect(), client.connect()
    assert register(drainer, job, orders, 2) == (job, True, 40, 20)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(row=drainer.execute(
            "CALL etc_batch.drain_job(%s)", (job,)).fetchone()), daemon=True)
    thread.start()
    wait_until(lambda: pg.admin.execute(
        "SELECT count(*) FROM etc_batch.job_audit WHERE job_id = %s", (job,)).fetchone()[0] > 0,
        "the drain to commit a chunk")
    operator.execute("SELECT etc_batch.pause_job(%s)", (job,))
    thread.join(60)
    assert not thread.is_alive()
    chunks, items, _, _, status = result["row"]
    assert status == "paused" and 0 < chunks < 20 and items == 2 * chunks, result
    again = drainer.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
    assert again == (0, 0, None, None, "paused")
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, items + 1)})
    operator.execute("SELECT etc_batch.resume_job(%s)", (job,))
    rest = drainer.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
    assert rest[4] == "done" and rest[1] == 40 - items
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 41)}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 41)})


def test_a_paced_drain_keeps_its_rate(pg, tables):
    """pace_job(rows_per_second): two drainers of a parallel job together stay at the
    rate, within 10 % over a few seconds."""
    orders = Orders(pg, "paced", 600)
    job = tag("paced")
    conn = pg.direct()
    conn.execute(
        "SELECT etc_batch.register_job(%s, 'X', %s::regclass, %s::jsonb, 20, %s::jsonb, "
        "parallel => true)",
        (job, orders.name, json.dumps(orders.items(None)), json.dumps({"status": "cancelled"})))
    conn.execute("SELECT etc_batch.pace_job(%s, 300)", (job,))
    started = time.monotonic()
    # what each drain returned or raised: an error in a thread is the test's to see
    ended = []

    def drain():
        ended.append(_call_error(pg.direct(), "CALL etc_batch.drain_job(%s)", (job,)))

    threads = [threading.Thread(target=drain, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    elapsed = time.monotonic() - started
    assert ended == [None, None], ended
    # 30 chunks of 20 rows at 300 rows a second: each starts 1/15 s after the one before
    rate = 600 / elapsed
    assert 270 <= rate <= 330, (rate, elapsed)
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 601)}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 601)})


def test_a_pace_changed_while_a_drain_runs_is_read_at_its_next_chunk(pg, tables):
    """A drain paced at 20 rows a second would need 10 s for 200 rows; the pace lifted
    from another session after a second, the same call finishes at full speed."""
    orders = Orders(pg, "repaced", 200)
    job = tag("repaced")
    conn = pg.direct()
    conn.execute(
        "SELECT etc_batch.register_job(%s, 'X', %s::regclass, %s::jsonb, 10, %s::jsonb)",
        (job, orders.name, json.dumps(orders.items(None)), json.dumps({"status": "cancelled"})))
    conn.execute("SELECT etc_batch.pace_job(%s, 20)", (job,))
    drainer = pg.direct()
    pid = drainer.info.backend_pid
    result = {}
    started = time.monotonic()
    thread = threading.Thread(target=lambda: result.update(row=drainer.execute(
        "CALL etc_batch.drain_job(%s)", (job,)).fetchone()), daemon=True)
    thread.start()
    wait_until(lambda: "paced, the next chunk in" in (pg.admin.execute(
        "SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] or ""),
        "the drain to wait for its slot")
    time.sleep(1.0)
    slow = sum(audit_by_key(pg, job).values())
    assert 0 < slow < 200, slow
    conn.execute("SELECT etc_batch.pace_job(%s, NULL)", (job,))
    thread.join(30)
    assert not thread.is_alive()
    elapsed = time.monotonic() - started
    assert result["row"][4] == "done" and result["row"][1] == 200, result
    # at 20 rows a second the rest would have taken (200 - slow) / 20 seconds more
    assert elapsed < 1.0 + (200 - slow) / 20 - 2, (elapsed, slow)
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 201)})


def test_a_drain_waits_for_a_slot_nobody_reads_holding_nothing(pg, tables):
    """pace_job(max_replica_lag_bytes): with a replication slot nobody reads holding back
    more WAL than that, the drain stops committing, says so once, and waits with no
    transaction id, no snapshot and no lock but its virtual transaction id; once the slot
    is gone it goes on and finishes, each order changed once."""
    orders = Orders(pg, "lagged", 200)
    job = tag("lagged")
    slot = tag("unread")
    conn = pg.direct()
    conn.execute(
        "SELECT etc_batch.register_job(%s, 'X', %s::regclass, %s::jsonb, 10, %s::jsonb)",
        (job, orders.name, json.dumps(orders.items(None)), json.dumps({"status": "cancelled"})))
    conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
    try:
        conn.execute("SELECT etc_batch.pace_job(%s, NULL, 1)", (job,))
        # some WAL after the slot's position, so that it is behind from the start
        conn.execute("SELECT pg_switch_wal()")
        drainer = pg.direct()
        notices = []
        drainer.add_notice_handler(lambda d: notices.append(d.message_primary))
        pid = drainer.info.backend_pid
        result = {}
        thread = threading.Thread(target=lambda: result.update(row=drainer.execute(
            "CALL etc_batch.drain_job(%s)", (job,)).fetchone()), daemon=True)
        thread.start()
        wait_until(lambda: "waiting for the replicas" in (pg.admin.execute(
            "SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] or ""),
            "the drain to wait for the slot")
        held = pg.admin.execute(
            "SELECT backend_xid, backend_xmin FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        locks = pg.admin.execute(
            "SELECT locktype, objsubid FROM pg_locks WHERE pid = %s ORDER BY 1", (pid,)).fetchall()
        assert tuple(held) == (None, None), held
        # nothing but its virtual transaction id, and the mark of a drainer at work (a
        # session lock of etc_batch's own key space, which nothing waits for)
        assert [tuple(l) for l in locks] == [("advisory", 4), ("virtualxid", None)], locks
        assert pg.admin.execute(
            "SELECT drainers, drainer_pid FROM etc_batch.job_progress WHERE job_id = %s",
            (job,)).fetchone() == (1, pid)
        waiting = pg.admin.execute(
            "SELECT waiting FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()[0]
        assert waiting.startswith(f'job "{job}": waiting for the replicas'), waiting
        assert audit_by_key(pg, job) == Counter()
        doctor = pg.admin.execute(
            "SELECT status FROM etc_batch.doctor() WHERE check_name = %s", (f"replication slot {slot}",)).fetchall()
        assert doctor == [("warn",)], doctor
    finally:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    thread.join(60)
    assert not thread.is_alive()
    assert result["row"][4] == "done", result
    assert sum(1 for n in notices if "waits: the replicas are" in n) == 1, notices
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 201)}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 201)})


# transient errors --------------------------------------------------------------------------


def retries_of(pg, job):
    return pg.admin.execute(
        "SELECT chunk, attempt, sqlstate FROM etc_batch.job_retry WHERE job_id = %s ORDER BY retried_at",
        (job,)).fetchall()


def test_a_row_lock_held_longer_than_chunk_lock_timeout_is_waited_out(pg, tables):
    """An application transaction holds a row of chunk 2 for about 1.5 s. With
    etc_batch.chunk_lock_timeout at 300 ms the chunk stops queueing, rolls back and backs
    off, holding nothing while it waits, and tries again; once the lock is gone it
    commits. The call returns normally, every order changed once."""
    orders = Orders(pg, "locked", 30)
    job = tag("locked")
    register(pg.admin, job, orders, 10)
    app = pg.direct(autocommit=False)
    app.execute(sql.SQL("SELECT 1 FROM {} WHERE tenant = 'X' AND id = 15 FOR UPDATE").format(orders.ident))
    drainer = pg.direct()
    drainer.execute("SET etc_batch.chunk_lock_timeout = '300ms'")
    pid = drainer.info.backend_pid
    drain = Drain(drainer, job)
    try:
        wait_until(lambda: len(retries_of(pg, job)) >= 2, "two retries of chunk 2")
        # between two looks at the same backoff, the drainer holds nothing
        def backing_off_holding_nothing():
            query = "SELECT query, backend_xid, backend_xmin FROM pg_stat_activity WHERE pid = %s"
            before = pg.admin.execute(query, (pid,)).fetchone()
            locks = pg.admin.execute(
                "SELECT locktype, objsubid FROM pg_locks WHERE pid = %s ORDER BY 1", (pid,)).fetchall()
            after = pg.admin.execute(query, (pid,)).fetchone()
            if before != after or "trying again in" not in (before[0] or ""):
                return None
            return before, locks
        (activity, xid, xmin), locks = wait_until(backing_off_holding_nothing, "a look at a backoff")
        assert activity.startswith(f'/* etc_batch: job "{job}": chunk 2 rolled back (55P03), trying again in'), activity
        assert (xid, xmin) == (None, None)
        assert [tuple(l) for l in locks] == [("advisory", 4), ("virtualxid", None)], locks
    finally:
        app.rollback()
    drain.join()
    assert drain.error is None, drain.error
    assert drain.result == (3, 30, "1", "30", "done"), drain.result
    retries = retries_of(pg, job)
    assert retries and all(r[0] == 2 and r[2] == "55P03" for r in retries), retries
    assert [r[1] for r in retries] == list(range(1, len(retries) + 1))
    said = [m for m in drain.notices.messages if "was rolled back: 55P03" in m]
    assert len(said) == len(retries), drain.notices.messages
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 31)}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 31)})


def test_a_deadlock_built_on_purpose_is_retried(pg, tables):
    """The drain's chunk has locked orders 1 to 19 and waits for order 20, which an
    application transaction holds; that transaction then asks for order 1. The drainer's
    deadlock check (deadlock_timeout 200 ms in its session, 10 s in the application's)
    picks the drain as the victim: its chunk rolls back, the application's transaction goes
    on and rolls back, and the chunk commits at its second attempt. Neither client sees
    a deadlock."""
    orders = Orders(pg, "deadlock", 20)
    job = tag("deadlock")
    register(pg.admin, job, orders, 20)
    app = pg.direct(autocommit=False)
    app.execute("SET deadlock_timeout = '10s'")
    app.execute(sql.SQL("UPDATE {} SET revision = revision WHERE tenant = 'X' AND id = 20").format(orders.ident))
    drainer = pg.direct()
    drainer.execute("SET deadlock_timeout = '200ms'")
    drainer.execute("SET etc_batch.chunk_lock_timeout = '30s'")
    pid = drainer.info.backend_pid
    drain = Drain(drainer, job)
    try:
        wait_until(lambda: pg.admin.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == "Lock",
            "the chunk to wait for order 20")
        # returns once the drain, the deadlock's victim, has rolled back and let order 1 go
        app.execute(sql.SQL("UPDATE {} SET revision = revision WHERE tenant = 'X' AND id = 1").format(orders.ident))
    finally:
        app.rollback()
    drain.join()
    assert drain.error is None, drain.error
    assert drain.result == (1, 20, "1", "20", "done"), drain.result
    assert retries_of(pg, job) == [(1, 1, "40P01")]
    assert any("was rolled back: 40P01 deadlock detected" in m for m in drain.notices.messages), drain.notices.messages
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 21)}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 21)})


def test_an_application_workload_reaches_the_drain_only_as_the_conflict_it_made(pg, tables):
    """Four application sessions update random rows of the job's table while it drains,
    five rows per transaction in random order, holding them 0.3 s: two thirds of the rows
    are not items of the job, and no update changes what the job checks, except one made before
    the drain, to item 2990. No deadlock or lock timeout reaches the drain's caller: the
    drain stops in conflict at item 2990, the one item really changed, with every item
    before its chunk changed once and nothing after."""
    table = tag("busy")
    ident = sql.Identifier(table)
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (tenant text NOT NULL, id integer NOT NULL, revision integer NOT NULL DEFAULT 1, "
        "status text NOT NULL DEFAULT 'pending', touched integer NOT NULL DEFAULT 0, "
        "PRIMARY KEY (tenant, id))").format(ident))
    pg.admin.execute(sql.SQL(
        "INSERT INTO {} (tenant, id) SELECT 'X', g FROM generate_series(1, 12000) g").format(ident))
    job = tag("busy")
    pg.admin.execute(
        "SELECT etc_batch.register_job(%s, 'X', %s::regclass, "
        "(SELECT jsonb_agg(jsonb_build_object('id', g, 'revision', 1)) FROM generate_series(1, 3000) g), "
        "50, %s::jsonb)",
        (job, table, json.dumps({"status": "cancelled"})))
    pg.admin.execute(sql.SQL("UPDATE {} SET revision = 2 WHERE tenant = 'X' AND id = 2990").format(ident))
    stop = threading.Event()
    holding = threading.Event()
    app_errors = []

    def application(seed):
        import random
        rnd = random.Random(seed)
        conn = pg.direct(autocommit=False)
        conn.execute("SET deadlock_timeout = '50ms'")
        first = True
        while not stop.is_set():
            # the first transaction of the first session holds item 100 (in chunk 2) when
            # the drain starts, so that at least one chunk waits longer than its timeout
            ids = [100] if first and seed == 1 else [rnd.randint(1, 9000) for _ in range(5)]
            try:
                for i in ids:
                    conn.execute(sql.SQL(
                        "UPDATE {} SET touched = touched + 1 WHERE tenant = 'X' AND id = %s").format(ident), (i,))
                if first and seed == 1:
                    holding.set()
                conn.execute("SELECT pg_sleep(%s)", (1.0 if first else 0.3,))
                conn.commit()
            except (errors.DeadlockDetected, errors.LockNotAvailable) as exc:
                conn.rollback()
                app_errors.append(type(exc).__name__)
            first = False

    apps = [threading.Thread(target=application, args=(seed,), daemon=True) for seed in (1, 2, 3, 4)]
    for t in apps:
        t.start()
    holding.wait(WAIT)
    drainer = pg.direct()
    drainer.execute("SET etc_batch.chunk_lock_timeout = '200ms'")
    drainer.execute("SET etc_batch.transient_attempts = 20")
    drainer.execute("SET deadlock_timeout = '1s'")
    try:
        with pytest.raises(errors.IntegrityConstraintViolation) as conflict:
            drainer.execute("CALL etc_batch.drain_job(%s)", (job,))
    finally:
        stop.set()
        for t in apps:
            t.join(WAIT)
    assert conflict.value.sqlstate == "23000", conflict.value
    assert "2990" in conflict.value.diag.message_detail, conflict.value.diag.message_detail
    status = pg.admin.execute(
        "SELECT status, committed FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()
    assert status == ("conflict", 2950), status
    audited = audit_by_key(pg, job)
    assert audited == Counter({i: 1 for i in range(1, 2951)}), len(audited)
    changed = dict(pg.admin.execute(sql.SQL(
        "SELECT id, status FROM {} WHERE status = 'cancelled'").format(ident)).fetchall())
    assert set(changed) == set(range(1, 2951))
    touched = pg.admin.execute(sql.SQL("SELECT sum(touched) FROM {}").format(ident)).fetchone()[0]
    retries = retries_of(pg, job)
    assert (2, 1, "55P03") in retries, retries
    assert {r[2] for r in retries} <= {"55P03", "40P01"}, retries
    print(f"application updates {touched}, retries {Counter(r[2] for r in retries)}, "
          f"application errors {Counter(app_errors)}")


# 3. autocommit off ----------------------------------------------------------------------------


def assert_refused_in_transaction_block(exc_info, procedure):
    exc = exc_info.value
    assert exc.sqlstate == "2D000"
    diag = exc.diag
    assert diag.message_primary == f"{procedure} cannot run inside a transaction block"
    assert "autocommit" in diag.message_detail, diag.message_detail
    assert "autocommit" in diag.message_hint, diag.message_hint
    assert "conn.autocommit = True" in diag.message_hint, diag.message_hint


def test_autocommit_off_refuses_drain_job(client, tables):
    pg = client.pg
    orders = Orders(pg, "acoff", 6)
    job = tag("acoff_job")
    register(pg.admin, job, orders, 2)
    conn = client.connect(autocommit=False)
    assert not conn.autocommit
    with pytest.raises(errors.InvalidTransactionTermination) as refused:
        conn.execute("CALL etc_batch.drain_job(%s)", (job,))
    assert_refused_in_transaction_block(refused, "etc_batch.drain_job")
    conn.rollback()
    assert job_state(pg, job) == ("pending", 0, 0)
    assert audit_by_key(pg, job) == Counter()
    assert orders.rows() == {i: (1, "pending") for i in range(1, 7)}
    # the same connection, autocommit on for the call: it works
    conn.autocommit = True
    assert conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone() == (
        3, 6, "1", "6", "done")


def test_autocommit_off_refuses_exec_batch_from_id(client, tables):
    pg = client.pg
    batch = tag("acoff_chain")
    first, second = add_side_chain(pg.admin, batch, 2)
    conn = client.connect(autocommit=False)
    with pytest.raises(errors.InvalidTransactionTermination) as refused:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
    assert_refused_in_transaction_block(refused, "etc_batch.exec_batch_from_id")
    conn.rollback()
    assert step_states(pg, batch) == [(first, "pending", 0), (second, "pending", 0)]
    assert side_counts(pg, batch) == {}
    assert pg.admin.execute(
        "SELECT count(*) FROM etc_batch.step_audit WHERE batch = %s", (batch,)
    ).fetchone() == (0,)


# 4. client_min_messages -------------------------------------------------------------------------


def run_and_collect(conn, pg, label):
    """Drains a fresh 3-chunk job and runs a fresh 2-step chain on conn; returns the
    notices conn received."""
    orders = Orders(pg, label, 6)
    job, batch = tag(f"{label}_job"), tag(f"{label}_chain")
    register(pg.admin, job, orders, 2)
    first, _second = add_side_chain(pg.admin, batch, 2)
    notices = Notices(conn)
    assert conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4] == "done"
    conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
    assert job_state(pg, job) == ("done", 6, 3)
    assert side_counts(pg, batch) == {1: 1, 2: 1}
    return notices.messages


def test_client_min_messages_warning_suppresses_the_notices(direct, tables):
    pg = direct.pg
    loud = direct.connect()
    messages = run_and_collect(loud, pg, "loud")
    assert len([m for m in messages if m.startswith("chunk ")]) == 3, messages
    assert len([m for m in messages if m.endswith("committed") and m.startswith("step ")]) == 2

    quiet = direct.connect()
    quiet.execute("SET client_min_messages = warning")
    assert run_and_collect(quiet, pg, "quiet") == []


@pytest.mark.parametrize("check_interval", ["0", "250ms"])
def test_a_quiet_drain_whose_client_dies(direct, tables, tmp_path, check_interval):
    """A psql that calls drain_job with client_min_messages = warning is killed while the
    drain runs. Nothing is sent to the client until the call ends, so by default the
    server learns of it only then: the drain goes on to the end. With
    client_connection_check_interval set, the server checks the connection while the
    call runs and ends the session within the interval: the chunk in flight rolls back,
    the committed ones stay (docs/live-systems.md, "A client that goes away")."""
    pg = direct.pg
    orders = Orders(pg, "orphan", 300)
    job = tag("orphan")
    conn = direct.connect()
    assert register(conn, job, orders, 10) == (job, True, 300, 30)
    conn.execute("SELECT etc_batch.pace_job(%s, 100)", (job,))  # three seconds in all
    app = tag("orphan_client")
    script = tmp_path / "orphan.sql"
    script.write_text(
        "SET client_min_messages = warning;\n"
        f"SET client_connection_check_interval = '{check_interval}';\n"
        f"CALL etc_batch.drain_job('{job}');\n")
    client = subprocess.Popen(
        ["psql", "-X", *direct.psql_args(), "-U", "postgres", "-f", str(script)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "PGAPPNAME": app})

    def backend():
        row = pg.admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                               (app,)).fetchone()
        return row[0] if row else None

    def committed():
        return pg.admin.execute("SELECT committed FROM etc_batch.job_progress WHERE job_id = %s",
                                (job,)).fetchone()[0]

    wait_until(lambda: backend() is not None and committed() > 0, "the drain to commit a chunk")
    client.kill()  # the client process dies: its socket is closed by the kernel
    client.wait(10)
    killed_at = committed()
    assert killed_at < 300
    if check_interval == "0":
        # nobody tells the server: the drain goes on to the end, then finds no client
        wait_until(lambda: job_state(pg, job)[0] == "done", "the orphaned drain to finish")
        wait_until(lambda: backend() is None, "the session to end once the call returns")
        assert committed() == 300
    else:
        wait_until(lambda: backend() is None, "the server to notice the client is gone",
                   timeout=5)
        left = committed()
        assert left < 300, "the drain went on to the end"
        time.sleep(1)
        assert committed() == left, "a chunk committed after the session ended"
        assert job_state(pg, job)[0] == "pending"
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, committed() + 1)})


def test_role_setting_suppresses_the_notices_through_pgbouncer(pg, bouncer, app_role, tables):
    """Through a transaction-mode pooler a plain SET does not stay with the client;
    ALTER ROLE ... IN DATABASE ... SET does, since every server connection of the role
    applies it when it starts."""
    ident = sql.Identifier(app_role)
    pg.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(ident))
    pg.admin.execute(
        sql.SQL(
            "GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, "
            "integer, bigint, text, text, text), etc_batch.exec_batch_from_id(bigint, boolean, "
            "text, text, bigint) TO {}"
        ).format(ident)
    )
    # it drains jobs the superuser registered: a runner that may act on every job
    pg.admin.execute(sql.SQL("GRANT UPDATE ON etc_batch.job TO {}").format(ident))
    pg.admin.execute(
        sql.SQL("ALTER ROLE {} IN DATABASE {} SET client_min_messages = warning").format(
            ident, sql.Identifier(pg.name)
        )
    )
    bouncer.admin("RECONNECT")
    quiet = bouncer.connect(pg.name, user=app_role)
    assert quiet.execute("SHOW client_min_messages").fetchone() == ("warning",)
    assert run_and_collect(quiet, pg, "pooled_quiet") == []

    loud = bouncer.connect(pg.name)
    assert loud.execute("SHOW client_min_messages").fetchone() == ("notice",)
    messages = run_and_collect(loud, pg, "pooled_loud")
    assert len([m for m in messages if m.startswith("chunk ")]) == 3, messages
    assert len([m for m in messages if m.startswith("step ")]) == 2, messages


# 5. cancellation --------------------------------------------------------------------------------


class Drain:
    """CALL etc_batch.drain_job(job) on conn in a thread; keeps the result or error."""

    def __init__(self, conn, job):
        self.conn = conn
        self.job = job
        self.result = None
        self.error = None
        self.notices = Notices(conn)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = self.conn.execute(
                "CALL etc_batch.drain_job(%s)", (self.job,)
            ).fetchone()
        except BaseException as exc:  # for the test to assert on
            self.error = exc

    def join(self):
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "drain_job did not return"


class BlockedJob:
    """A 30-item job in chunks of 10 whose handler waits for an advisory lock the test
    holds, from item 11 on: chunk 1 commits, chunk 2 blocks."""

    def __init__(self, pg, label):
        self.pg = pg
        self.key = secrets.randbelow(2**31 - 1) + 1
        self.orders = Orders(pg, label, 30)
        self.job = tag(f"{label}_job")
        handler = self.orders.handler(self.key, from_id=11)
        register(pg.admin, self.job, self.orders, 10, handler=handler)
        self.holder = pg.direct()
        self.holder.execute("SELECT pg_advisory_lock(%s)", (self.key,))

    def waiting_pid(self, pid=None):
        """The pid of a backend waiting for the gate's lock (pid, or any)."""
        row = self.pg.admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = %s::bigint::oid AND (%s::int IS NULL OR pid = %s::int)",
            (self.key, pid, pid),
        ).fetchone()
        return row and row[0]

    def wait_blocked(self, pid=None, drain=None):
        def blocked():
            if drain is not None and not drain.thread.is_alive():
                raise AssertionError(f"drain_job ended early: {drain.result} {drain.error!r}")
            return self.waiting_pid(pid)

        found = wait_until(blocked, "drain_job to block in chunk 2")
        # chunk 1 is committed while chunk 2 waits
        assert job_state(self.pg, self.job) == ("pending", 10, 1)
        return found

    def release(self):
        self.holder.execute("SELECT pg_advisory_unlock(%s)", (self.key,))

    def assert_after_cancel(self):
        assert job_state(self.pg, self.job) == ("pending", 10, 1)
        assert self.pg.admin.execute(
            "SELECT status, committed, drainer_pid FROM etc_batch.job_progress WHERE job_id = %s",
            (self.job,),
        ).fetchone() == ("pending", 10, None)
        assert audit_by_key(self.pg, self.job) == Counter({i: 1 for i in range(1, 11)})
        assert self.pg.admin.execute(
            "SELECT count(*) FROM etc_batch.job_audit WHERE job_id = %s AND chunk <> 1", (self.job,)
        ).fetchone() == (0,)
        assert self.orders.rows() == {
            i: (2, "cancelled") if i <= 10 else (1, "pending") for i in range(1, 31)
        }

    def finish(self, conn):
        self.release()
        assert conn.execute("CALL etc_batch.drain_job(%s)", (self.job,)).fetchone() == (
            2, 20, "11", "30", "done")
        assert job_state(self.pg, self.job) == ("done", 30, 3)
        assert audit_by_key(self.pg, self.job) == Counter({i: 1 for i in range(1, 31)})
        assert self.orders.rows() == {i: (2, "cancelled") for i in range(1, 31)}
        chunks = self.pg.admin.execute(
            "SELECT chunk, count(*) FROM etc_batch.job_audit WHERE job_id = %s GROUP BY chunk ORDER BY chunk",
            (self.job,),
        ).fetchall()
        assert chunks == [(1, 10), (2, 10), (3, 10)]


def test_pg_cancel_backend_cancels_drain_job_between_chunks(direct, tables):
    pg = direct.pg
    blocked = BlockedJob(pg, "cancel")
    conn = direct.connect()
    pid = conn.info.backend_pid
    drain = Drain(conn, blocked.job)
    blocked.wait_blocked(pid, drain)
    assert pg.admin.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone() == (True,)
    drain.join()
    assert isinstance(drain.error, errors.QueryCanceled), repr(drain.error)
    assert drain.error.sqlstate == "57014"
    assert drain.notices.messages == ["chunk 1 of 3 committed: 10 items, keys 1 to 10"]
    blocked.assert_after_cancel()
    blocked.finish(direct.connect())


def test_statement_timeout_cancels_drain_job_between_chunks(direct, tables):
    pg = direct.pg
    blocked = BlockedJob(pg, "timeout")
    conn = direct.connect()
    conn.execute("SET statement_timeout = '1s'")
    notices = Notices(conn)
    started = time.monotonic()
    with pytest.raises(errors.QueryCanceled) as cancelled:
        conn.execute("CALL etc_batch.drain_job(%s)", (blocked.job,))
    assert cancelled.value.sqlstate == "57014"
    assert "statement timeout" in cancelled.value.diag.message_primary
    assert 0.9 <= time.monotonic() - started < WAIT
    assert notices.messages == ["chunk 1 of 3 committed: 10 items, keys 1 to 10"]
    blocked.assert_after_cancel()
    # the same connection, after the timeout: the rest of the job
    conn.execute("RESET statement_timeout")
    blocked.finish(conn)


def test_cancel_request_through_pgbouncer_cancels_drain_job(pg, bouncer, tables):
    blocked = BlockedJob(pg, "pcancel")
    conn = bouncer.connect(pg.name)
    drain = Drain(conn, blocked.job)
    blocked.wait_blocked(drain=drain)
    conn.cancel_safe()  # a cancel request to PgBouncer, which forwards it to the server
    drain.join()
    assert isinstance(drain.error, errors.QueryCanceled), repr(drain.error)
    blocked.assert_after_cancel()
    blocked.finish(bouncer.connect(pg.name))


# 6. an orchestrator procedure ---------------------------------------------------------------


def test_plpgsql_orchestrator_commits_between_calls(client, tables):
    pg = client.pg
    proc = tag("orchestrate")
    pg.admin.execute(
        sql.SQL(
            """CREATE PROCEDURE {proc}(first_a bigint, first_b bigint, job text)
               LANGUAGE plpgsql AS $$
               DECLARE
                 chunks integer;
                 items  bigint;
                 k1     text;
                 k2     text;
                 st     text;
               BEGIN
                 CALL etc_batch.exec_batch_from_id(first_a);
                 COMMIT;
                 CALL etc_batch.exec_batch_from_id(first_b);
                 COMMIT;
                 CALL etc_batch.drain_job(job, NULL, NULL, NULL, NULL, chunks, items, k1, k2, st);
                 COMMIT;
                 INSERT INTO orchestrated (job, chunks, items, first_key, last_key, status)
                 VALUES (job, chunks, items, k1, k2, st);
               END $$"""
        ).format(proc=sql.Identifier(proc))
    )
    a, b = tag("orch_a"), tag("orch_b")
    a_ids = add_side_chain(pg.admin, a, 3)
    b_ids = add_side_chain(pg.admin, b, 2)
    orders = Orders(pg, "orch", 7)
    job = tag("orch_job")
    register(pg.admin, job, orders, 3)

    conn = client.connect()
    notices = Notices(conn)
    call = sql.SQL("CALL {}(%s, %s, %s)").format(sql.Identifier(proc))
    conn.execute(call, (a_ids[0], b_ids[0], job))
    assert len(notices.matching(r"^step \d+ of batch .* committed$")) == 5, notices.messages
    assert len(notices.matching(r"^chunk \d of 3 committed")) == 3, notices.messages
    # called again: every step skipped, the job found done; nothing runs twice
    conn.execute(call, (a_ids[0], b_ids[0], job))

    assert side_counts(pg, a) == {1: 1, 2: 1, 3: 1}
    assert side_counts(pg, b) == {1: 1, 2: 1}
    assert step_states(pg, a) == [(i, "done", 1) for i in a_ids]
    assert step_states(pg, b) == [(i, "done", 1) for i in b_ids]
    assert job_state(pg, job) == ("done", 7, 3)
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 8)})
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 8)}
    assert pg.admin.execute(
        "SELECT chunks, items, first_key, last_key, status FROM orchestrated WHERE job = %s "
        "ORDER BY at", (job,)
    ).fetchall() == [(3, 7, "1", "7", "done"), (0, 0, None, None, "done")]
    outcomes = pg.admin.execute(
        "SELECT outcome, count(*) FROM etc_batch.step_audit WHERE batch IN (%s, %s) GROUP BY outcome",
        (a, b),
    ).fetchall()
    assert dict(outcomes) == {"done": 5, "skipped": 5}


# chains that orchestrate -----------------------------------------------------------------


def test_a_chain_step_that_drains_a_job_killed_mid_drain_finishes_exactly_once(client, tables):
    """A chain's step drains a job (commits => true) and another runs a procedure of the
    user's that commits every row. The runner is terminated in the middle of the drain:
    the chunks it committed stay, the step stays pending; run again, the chain finishes
    the job (every item once), the step is done once, and the user's procedure runs."""
    pg = client.pg
    orders = Orders(pg, "chained", 60)
    job = tag("chained")
    handler = orders.handler(lock_key := secrets.randbelow(2**31 - 1) + 1, from_id=31)
    register(pg.admin, job, orders, 10, handler=handler)
    proc = tag("load_rows")
    pg.admin.execute(sql.SQL(
        """CREATE PROCEDURE {proc}(batch text) LANGUAGE plpgsql AS $$
           BEGIN
             FOR i IN 1..3 LOOP
               INSERT INTO side (batch, step) VALUES (batch, 1000 + i);
               COMMIT;
             END LOOP;
           END $$""").format(proc=sql.Identifier(proc)))
    batch = tag("combo")
    first = pg.admin.execute("SELECT etc_batch.add_step(%s, %s)",
                             (batch, f"INSERT INTO side (batch, step) VALUES ('{batch}', 1)")).fetchone()[0]
    drain_step = pg.admin.execute("SELECT etc_batch.add_step(%s, %s, commits => true)",
                                  (batch, f"CALL etc_batch.drain_job('{job}')")).fetchone()[0]
    pg.admin.execute("SELECT etc_batch.add_step(%s, %s, commits => true)",
                     (batch, f"CALL {proc}('{batch}')"))
    # chunks 1 to 3 commit; chunk 4 waits for the lock the test holds
    holder = pg.direct()
    holder.execute("SELECT pg_advisory_lock(%s)", (lock_key,))
    runner = client.connect()
    notices = Notices(runner)
    pid = runner.info.backend_pid if not client.pooled else None
    done = {}
    thread = threading.Thread(target=lambda: done.update(error=_call_error(
        runner, "CALL etc_batch.exec_batch_from_id(%s)", (first,))), daemon=True)
    thread.start()
    waiting = wait_until(lambda: pg.admin.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s::bigint::oid",
        (lock_key,)).fetchone(), "the drain to wait in chunk 4")
    assert pid is None or waiting[0] == pid
    # the step's session lock, held while its procedure runs
    assert pg.admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 3 AND granted "
        "AND objid = %s::bigint::oid", (drain_step,)).fetchone() == (1,)
    pg.admin.execute("SELECT pg_terminate_backend(%s)", (waiting[0],))
    thread.join(WAIT)
    assert not thread.is_alive()
    # the runner's backend was terminated: the client is told so, straight or through
    # PgBouncer, which passes the server's FATAL on
    assert isinstance(done["error"], errors.AdminShutdown), repr(done["error"])
    assert done["error"].sqlstate == "57P01"
    holder.execute("SELECT pg_advisory_unlock(%s)", (lock_key,))
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 31)})
    assert statuses(pg, batch)[drain_step] == "pending"

    again = client.connect()
    again.execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
    assert set(statuses(pg, batch).values()) == {"done"}
    assert audit_by_key(pg, job) == Counter({i: 1 for i in range(1, 61)})
    assert orders.rows() == {i: (2, "cancelled") for i in range(1, 61)}
    assert job_state(pg, job)[0] == "done"
    assert side_counts(pg, batch) == Counter({1: 1, 1001: 1, 1002: 1, 1003: 1})
    outcomes = pg.admin.execute(
        "SELECT outcome, count(*) FROM etc_batch.step_audit WHERE step_id = %s GROUP BY outcome",
        (drain_step,)).fetchall()
    assert outcomes == [("done", 1)], outcomes


def statuses(pg, batch):
    return {id: status for id, status, _ in step_states(pg, batch)}


def _call_error(conn, statement, params):
    try:
        conn.execute(statement, params)
    except BaseException as exc:  # for the test to assert on
        return exc
    return None


def test_two_runners_at_a_step_that_commits_run_it_once_and_warn_of_nothing(pg, tables):
    """Two callers of the same chain meet at a step that commits: the one that finds the
    step's session lock taken waits for it (longer than deadlock_timeout, 1 s), then
    skips the step as done. Neither is told anything but the chain's own NOTICEs: a lock
    not granted was once released all the same, drawing "you don't own a lock of type
    ExclusiveLock"; and no step lock is left held once the calls are over."""
    proc = tag("slow_commit")
    pg.admin.execute(sql.SQL(
        """CREATE PROCEDURE {proc}(batch text) LANGUAGE plpgsql AS $$
           BEGIN
             INSERT INTO side (batch, step) VALUES (batch, 1);
             COMMIT;
             PERFORM pg_sleep(1.5);
             INSERT INTO side (batch, step) VALUES (batch, 2);
             COMMIT;
           END $$""").format(proc=sql.Identifier(proc)))
    batch = tag("met")
    first = pg.admin.execute("SELECT etc_batch.add_step(%s, %s, commits => true)",
                             (batch, f"CALL {proc}('{batch}')")).fetchone()[0]
    pg.admin.execute("SELECT etc_batch.add_step(%s, %s)",
                     (batch, f"INSERT INTO side (batch, step) VALUES ('{batch}', 3)"))
    runners = [pg.direct() for _ in range(2)]
    heard = [Notices(r) for r in runners]
    for r in runners:
        r.execute("SET client_min_messages = 'notice'")
    done = {}
    threads = [threading.Thread(target=lambda k=k, r=r: done.update({k: _call_error(
        r, "CALL etc_batch.exec_batch_from_id(%s)", (first,))}), daemon=True)
        for k, r in enumerate(runners)]
    threads[0].start()
    # the second comes while the first is inside the step's procedure
    wait_until(lambda: pg.admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 3 AND granted "
        "AND objid = %s::bigint::oid", (first,)).fetchone() == (1,), "the first runner in the step")
    threads[1].start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert done == {0: None, 1: None}
    assert set(statuses(pg, batch).values()) == {"done"}
    assert side_counts(pg, batch) == Counter({1: 1, 2: 1, 3: 1})
    outcomes = pg.admin.execute(
        "SELECT outcome::text, count(*) FROM etc_batch.step_audit WHERE step_id = %s GROUP BY 1 ORDER BY 1",
        (first,)).fetchall()
    assert outcomes == [("done", 1), ("skipped", 1)], outcomes
    said = heard[0].messages + heard[1].messages
    assert not [m for m in said if "own a lock" in m], said
    assert [m for m in heard[1].messages if "skipped" in m or "already done" in m], heard[1].messages
    assert pg.admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 3 "
        "AND objid = %s::bigint::oid", (first,)).fetchone() == (0,)


def test_a_step_that_deadlocks_on_purpose_succeeds_on_its_second_attempt(pg, tables):
    """Step (max_attempts => 2) updates row 1 then row 2 of a table while another session
    holds row 2 and then asks for row 1: the step, whose deadlock check runs first, is
    the victim; its attempt is rolled back and recorded as retried, and the second
    attempt commits once the other session is done."""
    table = tag("pair")
    pg.admin.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)")
                     .format(sql.Identifier(table)))
    pg.admin.execute(sql.SQL("INSERT INTO {} VALUES (1), (2)").format(sql.Identifier(table)))
    batch = tag("deadlock")
    step = pg.admin.execute(
        "SELECT etc_batch.add_step(%s, %s, max_attempts => 2)",
        (batch, f"UPDATE {table} SET v = v + 1 WHERE id = 1; UPDATE {table} SET v = v + 1 WHERE id = 2")).fetchone()[0]
    other = pg.direct(autocommit=False)
    other.execute("SET deadlock_timeout = '10s'")
    other.execute(sql.SQL("UPDATE {} SET v = v + 10 WHERE id = 2").format(sql.Identifier(table)))
    runner = pg.direct()
    runner.execute("SET deadlock_timeout = '200ms'")
    notices = Notices(runner)
    pid = runner.info.backend_pid
    done = {}
    thread = threading.Thread(target=lambda: done.update(error=_call_error(
        runner, "CALL etc_batch.exec_batch_from_id(%s)", (step,))), daemon=True)
    thread.start()
    wait_until(lambda: pg.admin.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == "Lock",
        "the step to wait for row 2")
    # returns once the step, the deadlock's victim, has rolled back and let row 1 go
    other.execute(sql.SQL("UPDATE {} SET v = v + 10 WHERE id = 1").format(sql.Identifier(table)))
    other.commit()
    thread.join(WAIT)
    assert not thread.is_alive() and done["error"] is None, done
    assert statuses(pg, batch) == {step: "done"}
    assert pg.admin.execute(sql.SQL("SELECT id, v FROM {} ORDER BY id").format(sql.Identifier(table))).fetchall() \
        == [(1, 11), (2, 11)]
    audit = pg.admin.execute(
        "SELECT attempt, outcome, sqlstate FROM etc_batch.step_audit WHERE step_id = %s ORDER BY audit_id",
        (step,)).fetchall()
    assert audit == [(1, "retried", "40P01"), (2, "done", None)], audit
    assert notices.matching(r"was rolled back: 40P01 deadlock detected; attempt 1 of 2"), notices.messages


def test_a_step_that_times_out_fails_as_timed_out(client, tables):
    """timeout => '200ms' on a step that sleeps a second: 57014, the step failed and
    recorded as timed_out; a cancel of the whole call leaves a step pending instead."""
    pg = client.pg
    batch = tag("slow")
    step = pg.admin.execute("SELECT etc_batch.add_step(%s, 'SELECT pg_sleep(1)', timeout => '200ms')",
                            (batch,)).fetchone()[0]
    conn = client.connect()
    with pytest.raises(errors.QueryCanceled) as timed_out:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (step,))
    assert "timed out after 200 ms, its timeout" in timed_out.value.diag.message_detail
    assert statuses(pg, batch) == {step: "failed"}
    assert pg.admin.execute("SELECT outcome, sqlstate FROM etc_batch.step_audit WHERE step_id = %s",
                            (step,)).fetchall() == [("timed_out", "57014")]
    # the caller's own statement_timeout, sooner, is a cancel: the step stays pending
    pg.admin.execute("SELECT etc_batch.retry_step(%s)", (step,))
    pg.admin.execute("UPDATE etc_batch.batch_log SET timeout = '5s' WHERE id = %s", (step,))
    conn.execute("SET statement_timeout = '300ms'")
    with pytest.raises(errors.QueryCanceled):
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (step,))
    conn.execute("SET statement_timeout = 0")
    assert statuses(pg, batch) == {step: "pending"}


def test_user_defined_sqlstates_reach_psql_and_psycopg(client, tables, tmp_path):
    """A step's RAISE ... USING ERRCODE = 'UE001' (and 22P99, P0099) reaches psycopg and
    psql with that SQLSTATE, message, detail and hint, and batch_log records it."""
    pg = client.pg
    fn = tag("boom")
    pg.admin.execute(sql.SQL(
        """CREATE FUNCTION {fn}(code text) RETURNS void LANGUAGE plpgsql AS $$
           BEGIN
             RAISE EXCEPTION 'failed with %', code
               USING ERRCODE = code, DETAIL = 'Raised on purpose.', HINT = 'Nothing to do.';
           END $$""").format(fn=sql.Identifier(fn)))
    conn = client.connect()
    for code in ("UE001", "22P99", "P0099"):
        batch = tag("codes")
        step = pg.admin.execute("SELECT etc_batch.add_step(%s, %s)",
                                (batch, f"SELECT {fn}('{code}')")).fetchone()[0]
        with pytest.raises(errors.Error) as raised:
            conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (step,))
        diag = raised.value.diag
        assert (diag.sqlstate, diag.message_primary, diag.message_detail, diag.message_hint) == (
            code, f"failed with {code}", "Raised on purpose.", "Nothing to do."), code
        assert f"PL/pgSQL function {fn}(text) line 3 at RAISE" in diag.context
        assert pg.admin.execute("SELECT last_sqlstate FROM etc_batch.batch_log WHERE id = %s",
                                (step,)).fetchone() == (code,)
    batch = tag("codes_psql")
    step = pg.admin.execute("SELECT etc_batch.add_step(%s, %s)",
                            (batch, f"SELECT {fn}('UE001')")).fetchone()[0]
    shown = run_psql(client, "\\set VERBOSITY verbose\nCALL etc_batch.exec_batch_from_id(:step);\n",
                     {"step": step}, tmp_path)
    assert shown.returncode != 0
    assert "ERROR:  UE001: failed with UE001" in shown.stderr, shown.stderr


def test_a_chain_that_would_call_itself_is_refused(client, tables):
    pg = client.pg
    batch = tag("selfish")
    first = pg.admin.execute("SELECT etc_batch.add_step(%s, %s)",
                             (batch, f"INSERT INTO side (batch, step) VALUES ('{batch}', 1)")).fetchone()[0]
    pg.admin.execute("SELECT etc_batch.add_step(%s, %s, commits => true)",
                     (batch, f"CALL etc_batch.exec_batch_from_id({first})"))
    conn = client.connect()
    with pytest.raises(errors.InvalidObjectDefinition) as refused:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
    assert refused.value.diag.message_primary == f'chain "{batch}" would run itself again'
    assert side_counts(pg, batch) == Counter()


def test_the_doctor_says_what_a_launch_outside_its_windows_waits_for(pg, tables):
    """A launched job outside its windows is nothing wrong: the doctor says so in a row
    that is no warning (what its worker waits for, when the window opens, when the job
    should finish), and job_progress's estimated_finish counts the wait for the window,
    not the minutes of work alone; the rate at work and the rate of the clock are both
    there, named."""
    orders = Orders(pg, "windowed_launch", 200)
    job = tag("windowed_launch")
    conn = pg.direct()
    conn.execute(
        "SELECT etc_batch.register_job(%s, 'X', %s::regclass, %s::jsonb, 20, %s::jsonb)",
        (job, orders.name, json.dumps(orders.items(None)), json.dumps({"status": "cancelled"})))
    # two chunks drained now: a rate to reckon from, a few minutes of work at most left
    conn.execute("CALL etc_batch.drain_job(%s, 2)", (job,))
    # one hour a day, opening in about twelve hours, in UTC
    opens, closes = conn.execute(
        "SELECT to_char(t, 'HH24:MI'), to_char(t + interval '1 hour', 'HH24:MI') "
        "FROM (SELECT date_trunc('minute', now() AT TIME ZONE 'UTC') + interval '12 hours' AS t) s").fetchone()
    conn.execute("SELECT etc_batch.pace_job(%s, windows => ARRAY[%s], time_zone => 'UTC')",
                 (job, f"mon-sun {opens}-{closes}"))
    launch_id = conn.execute("SELECT launch_id FROM etc_batch.launch_job(%s)", (job,)).fetchone()[0]
    try:
        wait_until(lambda: pg.admin.execute(
            "SELECT waiting FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()[0]
            is not None, "the worker to wait for the window")
        progress = pg.admin.execute(
            "SELECT committed, waiting, estimated_finish - now() AS to_go, items_per_second, "
            "items_per_second_elapsed FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()
        committed, waiting, to_go, at_work, elapsed = progress
        assert committed == 40
        prefix = f'job "{job}": waiting for its windows, the next opens in '
        assert waiting in (prefix + "12 h", prefix + "11 h 59 min"), waiting
        # the rest starts when the window opens: about twelve hours, not minutes
        assert timedelta(hours=11, minutes=55) < to_go < timedelta(hours=13), to_go
        assert at_work > 0 and elapsed > 0
        doctor = pg.admin.execute(
            "SELECT status, detail, hint FROM etc_batch.doctor() WHERE check_name = %s",
            (f"job {job}",)).fetchall()
        assert len(doctor) == 1, doctor
        status, detail, hint = doctor[0]
        assert status == "ok" and hint is None
        said = waiting[len(f'job "{job}": '):]
        assert detail.startswith(f"Its drainers wait, as its pace says: {said}. 40 of 200 items committed; "
                                 "it should finish around "), detail
        # no launch of the job is named as a fault meanwhile
        assert not pg.admin.execute(
            "SELECT check_name FROM etc_batch.doctor() WHERE status <> 'ok' AND "
            "(check_name = %s OR check_name = %s)", (f"job {job}", f"launch {launch_id}")).fetchall()
    finally:
        conn.execute("SELECT etc_batch.stop_launch(%s)", (launch_id,))
    assert wait_launch(pg, launch_id) == "stopped"
