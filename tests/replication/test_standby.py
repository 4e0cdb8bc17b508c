"""etc_batch with a real streaming standby downstream (conftest.py starts both).

1. On the hot standby every routine that writes refuses at once with 25006 and a hint
   naming the primary; the views, the reports and doctor() work and say it is a standby.
2. With replay paused on the standby (pg_wal_replay_pause) and a small
   max_replica_lag_bytes, a drain stops committing and waits, holding nothing; after
   pg_wal_replay_resume it goes on and finishes, each item once, on both servers.
3. The same with a logical replication slot nobody reads from, until it is advanced.
4. With the standby synchronous, the primary is stopped with -m immediate in the middle
   of a drain and of a chain, and the standby promoted: every chunk and step whose
   COMMIT reached the client is there, nothing is half-applied, the work finishes
   exactly once on the new primary, verify_job is clean, and no lease generation is
   handed out twice. (Last: it ends the pair.)
"""

import json
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from psycopg import errors, sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT, WAIT, close_quietly, pg_bin, wait_until  # noqa: E402

PRIMARY = "host 127.0.0.1 port 55480"
MEGABYTE = 1024 * 1024


def tag(label):
    return f"{label}_{secrets.token_hex(3)}"


def make_orders(conn, n):
    name = tag("orders")
    conn.execute(sql.SQL(
        "CREATE TABLE {} (tenant text NOT NULL, id integer NOT NULL, revision integer NOT NULL DEFAULT 1, "
        "status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))").format(sql.Identifier(name)))
    conn.execute(sql.SQL("INSERT INTO {} (tenant, id) SELECT 'X', g FROM generate_series(1, %s) g")
                 .format(sql.Identifier(name)), (n,))
    return name


def register(conn, job, table, n, chunk_size):
    conn.execute(
        "SELECT etc_batch.register_job(%s, 'X', %s::regclass, %s::jsonb, %s, %s::jsonb)",
        (job, table, json.dumps([{"id": i, "revision": 1} for i in range(1, n + 1)]), chunk_size,
         json.dumps({"status": "cancelled"})))


def audit_by_key(conn, job):
    return Counter({int(k): n for k, n in conn.execute(
        "SELECT item_key, count(*) FROM etc_batch.job_audit_items WHERE job_id = %s GROUP BY item_key",
        (job,))})


def rows(conn, table):
    return {r[0]: (r[1], r[2]) for r in conn.execute(
        sql.SQL("SELECT id, revision, status FROM {}").format(sql.Identifier(table)))}


def replayed(primary_conn, standby_conn):
    """Waits until the standby has replayed everything the primary has written so far."""
    target = primary_conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    wait_until(lambda: standby_conn.execute(
        "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(target),)).fetchone()[0],
        "the standby to replay the primary's WAL")


def write_wal(conn, megabytes):
    """Writes about that much WAL, in a table of its own."""
    conn.execute(sql.SQL("CREATE TABLE {} AS SELECT g, repeat('x', 1000) AS pad "
                         "FROM generate_series(1, %s) g").format(sql.Identifier(tag("filler"))),
                 (megabytes * 1000,))


class Call:
    """A statement run in a thread on its own connection, its NOTICEs and its outcome kept."""

    def __init__(self, conn, statement, params=()):
        self.conn = conn
        self.pid = conn.info.backend_pid
        self.notices = []
        conn.add_notice_handler(lambda d: self.notices.append(d.message_primary))
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, args=(statement, params), daemon=True)
        self.thread.start()

    def _run(self, statement, params):
        try:
            self.result = self.conn.execute(statement, params).fetchone()
        except BaseException as exc:  # for the test to assert on
            self.error = exc

    def join(self, timeout=60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the call did not return; notices {self.notices[-5:]}"


def assert_waits_holding_nothing(admin, call, job, what):
    """The call waits (its pg_stat_activity says `what`) with no transaction id, no
    snapshot and no lock but its virtual transaction id (and the mark of a drainer at
    work, a session lock of etc_batch's own key space), and has committed nothing."""
    wait_until(lambda: what in (admin.execute(
        "SELECT query FROM pg_stat_activity WHERE pid = %s", (call.pid,)).fetchone()[0] or ""),
        f"the drain to wait: {what}")
    held = admin.execute(
        "SELECT backend_xid, backend_xmin FROM pg_stat_activity WHERE pid = %s", (call.pid,)).fetchone()
    locks = admin.execute(
        "SELECT locktype, objsubid FROM pg_locks WHERE pid = %s ORDER BY 1", (call.pid,)).fetchall()
    assert tuple(held) == (None, None), held
    assert [tuple(l) for l in locks] == [("advisory", 4), ("virtualxid", None)], locks
    waiting = admin.execute(
        "SELECT waiting FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()[0]
    assert waiting and waiting.startswith(f'job "{job}": waiting for the replicas'), waiting
    assert audit_by_key(admin, job) == Counter()


# 1. the hot standby ----------------------------------------------------------------------


WRITERS = [
    ("etc_batch.drain_job", "CALL etc_batch.drain_job(%(job)s)"),
    ("etc_batch.exec_batch_from_id", "CALL etc_batch.exec_batch_from_id(%(step)s)"),
    ("etc_batch.add_step", "SELECT etc_batch.add_step(%(batch)s, 'SELECT 1')"),
    ("etc_batch.reset_batch", "SELECT etc_batch.reset_batch(%(batch)s)"),
    ("etc_batch.retry_step", "SELECT etc_batch.retry_step(%(step)s)"),
    ("etc_batch.pause_batch", "SELECT etc_batch.pause_batch(%(batch)s)"),
    ("etc_batch.resume_batch", "SELECT etc_batch.resume_batch(%(batch)s)"),
    ("etc_batch.register_job", "SELECT etc_batch.register_job('new', 'X', %(table)s::regclass, "
                               "'[{\"id\": 1, \"revision\": 1}]', 1, '{\"status\": \"x\"}')"),
    ("etc_batch.register_job_from_query",
     "SELECT etc_batch.register_job_from_query('new', 'X', %(table)s::regclass, "
     "'SELECT 1 AS id, 1 AS revision', 1, '{\"status\": \"x\"}')"),
    ("etc_batch.verify_job", "SELECT etc_batch.verify_job(%(job)s)"),
    ("etc_batch.abort_job", "SELECT etc_batch.abort_job(%(job)s, 'no')"),
    ("etc_batch.pause_job", "SELECT etc_batch.pause_job(%(job)s)"),
    ("etc_batch.resume_job", "SELECT etc_batch.resume_job(%(job)s)"),
    ("etc_batch.pace_job", "SELECT etc_batch.pace_job(%(job)s, 10)"),
    ("etc_batch.acquire_lease", "SELECT etc_batch.acquire_lease('l', 'h', '1 minute')"),
    ("etc_batch.release_lease", "SELECT etc_batch.release_lease('l', 'h')"),
    ("etc_batch.check_lease", "SELECT etc_batch.check_lease('l', 'h', 1)"),
    ("etc_batch.prune_history", "SELECT etc_batch.prune_history('1 day')"),
    ("etc_batch.register_remainder", "SELECT etc_batch.register_remainder(%(job)s, 'rest')"),
    ("etc_batch.launch_job", "SELECT etc_batch.launch_job(%(job)s)"),
    ("etc_batch.launch_batch", "SELECT etc_batch.launch_batch(%(step)s)"),
    ("etc_batch.stop_launch", "SELECT etc_batch.stop_launch(1)"),
    ("etc_batch.resume_launches", "SELECT etc_batch.resume_launches()"),
    ("etc_batch.define_chain", "SELECT etc_batch.define_chain('nightly')"),
    ("etc_batch.run_chain", "CALL etc_batch.run_chain('nightly')"),
    ("etc_batch.abandon_run", "SELECT etc_batch.abandon_run('nightly', '2026-12-01')"),
]


def test_the_standby_refuses_every_writer_and_reads_everything(primary, standby):
    p = primary.connect()
    s = standby.connect()
    try:
        table = make_orders(p, 10)
        job = tag("kept")
        register(p, job, table, 10, 5)
        p.execute("CALL etc_batch.drain_job(%s, 1)", (job,))
        batch = tag("kept_chain")
        step = p.execute("SELECT etc_batch.add_step(%s, 'SELECT 1')", (batch,)).fetchone()[0]
        replayed(p, s)
        values = {"job": job, "batch": batch, "step": step, "table": table}
        for routine, statement in WRITERS:
            with pytest.raises(errors.ReadOnlySqlTransaction) as refused:
                s.execute(statement, values)
            diag = refused.value.diag
            assert diag.message_primary == f"{routine} cannot run on a standby", (routine, diag.message_primary)
            assert diag.message_detail == (
                "This server is in recovery, a hot standby: it replays the primary's WAL and cannot "
                "write. etc_batch's views and doctor() work here; its work runs on the primary."), routine
            assert diag.message_hint == (
                f"Run it on the primary, at {PRIMARY} (this standby's primary_conninfo)."), (routine, diag.message_hint)
        # as psql shows it (docs/live-systems.md quotes this file)
        shown = subprocess.run(
            ["psql", "-X", "-e", "-h", str(standby.socket_dir), "-p", str(standby.port), "-U", "postgres",
             "-d", standby.test_db, "-c", f"CALL etc_batch.drain_job('{job}')"],
            capture_output=True, text=True, timeout=60)
        expected = (Path(__file__).parent / "expected" / "standby.out").read_text()
        assert (shown.stdout + shown.stderr).replace(job, "backfill") == expected
        # the reads work, and say where they are
        assert s.execute(
            "SELECT status, committed, on_standby FROM etc_batch.job_progress WHERE job_id = %s",
            (job,)).fetchone() == ("pending", 5, True)
        assert s.execute(
            "SELECT steps, pending, on_standby FROM etc_batch.chain_progress WHERE batch = %s",
            (batch,)).fetchone() == (1, 1, True)
        assert p.execute(
            "SELECT on_standby FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone() == (False,)
        assert s.execute("SELECT count(*) FROM etc_batch.job_report(%s)", (job,)).fetchone() == (10,)
        doctor = s.execute(
            "SELECT status, hint FROM etc_batch.doctor() WHERE check_name = 'standby'").fetchall()
        assert doctor == [("warn", f"Run the work on the primary, at {PRIMARY}.")], doctor
        assert p.execute(
            "SELECT count(*) FROM etc_batch.doctor() WHERE check_name = 'standby'").fetchone() == (0,)
        # nothing was written: the primary's job is where it was
        assert p.execute("SELECT status, committed FROM etc_batch.job_progress WHERE job_id = %s",
                         (job,)).fetchone() == ("pending", 5)
    finally:
        close_quietly([p, s])


# 2. and 3. lag --------------------------------------------------------------------------


def lag_bound_job(conn, label):
    """A 100-item job in chunks of 10 over a table of its own, whose drains wait while
    anything downstream is more than a megabyte behind."""
    table = make_orders(conn, 100)
    job = tag(label)
    register(conn, job, table, 100, 10)
    conn.execute("SELECT etc_batch.pace_job(%s, NULL, %s)", (job, MEGABYTE))
    return table, job


def assert_drained_once(conn, call, job, table):
    call.join()
    assert call.error is None, call.error
    assert call.result[1] == 100 and call.result[4] == "done", call.result
    assert audit_by_key(conn, job) == Counter({i: 1 for i in range(1, 101)})
    assert rows(conn, table) == {i: (2, "cancelled") for i in range(1, 101)}


def test_a_paused_replay_holds_the_drain_back_until_it_resumes(primary, standby):
    p = primary.connect()
    s = standby.connect()
    try:
        table, job = lag_bound_job(p, "replay")
        replayed(p, s)
        s.execute("SELECT pg_wal_replay_pause()")
        wait_until(lambda: s.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()[0] == "paused",
                   "replay to pause")
        write_wal(p, 3)
        drain = Call(primary.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        assert_waits_holding_nothing(p, drain, job, "waiting for the replicas")
        time.sleep(1.0)
        assert audit_by_key(p, job) == Counter(), "a chunk committed while the standby was behind"
        s.execute("SELECT pg_wal_replay_resume()")
        assert_drained_once(p, drain, job, table)
        assert sum(1 for n in drain.notices if "waits: the replicas are" in n) == 1, drain.notices
        replayed(p, s)
        assert audit_by_key(s, job) == Counter({i: 1 for i in range(1, 101)})
        assert s.execute("SELECT status FROM etc_batch.job_progress WHERE job_id = %s",
                         (job,)).fetchone() == ("done",)
    finally:
        s.execute("SELECT pg_wal_replay_resume()")
        close_quietly([p, s])


def test_a_critical_replica_lag_pauses_the_job_with_its_reason(primary, standby):
    """pause_above_replica_lag_bytes: a standby whose replay is paused falls behind by
    more than the limit, and the job is paused by etc_batch itself, the reason kept in
    job_progress and the server's log; a person resumes it once the standby caught up."""
    p = primary.connect()
    s = standby.connect()
    try:
        table = make_orders(p, 100)
        job = tag("critical_lag")
        register(p, job, table, 100, 10)
        p.execute("SELECT etc_batch.pace_job(%s, pause_above_replica_lag_bytes => %s)", (job, MEGABYTE))
        replayed(p, s)
        s.execute("SELECT pg_wal_replay_pause()")
        wait_until(lambda: s.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()[0] == "paused",
                   "replay to pause")
        write_wal(p, 3)
        drain = Call(primary.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        drain.join()
        assert drain.error is None, drain.error
        assert drain.result[4] == "paused" and drain.result[1] == 0, drain.result
        assert any("is paused; this call stops here" in n for n in drain.notices), drain.notices
        reason = p.execute("SELECT pause_reason FROM etc_batch.job_progress WHERE job_id = %s",
                           (job,)).fetchone()[0]
        assert reason.startswith("the replicas were ") and reason.endswith(
            f"bytes of WAL behind, more than pause_above_replica_lag_bytes {MEGABYTE}"), reason
        assert f'etc_batch paused job "{job}": the replicas were ' in primary.server_log()
        assert audit_by_key(p, job) == Counter()
        s.execute("SELECT pg_wal_replay_resume()")
        replayed(p, s)
        p.execute("SELECT etc_batch.resume_job(%s)", (job,))
        again = Call(primary.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        assert_drained_once(p, again, job, table)
    finally:
        s.execute("SELECT pg_wal_replay_resume()")
        close_quietly([p, s])


def test_a_logical_slot_nobody_reads_holds_the_drain_back_until_it_is_read(primary, standby):
    p = primary.connect()
    slot = tag("cdc")
    try:
        table, job = lag_bound_job(p, "cdc")
        p.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
        write_wal(p, 3)
        drain = Call(primary.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        assert_waits_holding_nothing(p, drain, job, "waiting for the replicas")
        doctor = p.execute("SELECT status FROM etc_batch.doctor() WHERE check_name = %s",
                           (f"replication slot {slot}",)).fetchall()
        assert doctor == [("warn",)], doctor
        time.sleep(1.0)
        assert audit_by_key(p, job) == Counter()
        # a consumer reads everything so far
        p.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
        assert_drained_once(p, drain, job, table)
    finally:
        p.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        close_quietly([p])


# 4. failover ----------------------------------------------------------------------------


def stop_immediately(cluster):
    data = ROOT / "target" / "pg" / cluster.name / "data"
    done = subprocess.run(["runuser", "-u", "postgres", "--", str(pg_bin() / "pg_ctl"),
                           "-D", str(data), "-m", "immediate", "-w", "stop"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_failover_to_the_synchronous_standby_loses_no_commit(primary, standby):
    p = primary.connect()
    s = standby.connect()
    p.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
    p.execute("SELECT pg_reload_conf()")
    wait_until(lambda: p.execute(
        "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'").fetchone()
        == ("sync",), "the standby to be synchronous")

    table = make_orders(p, 3000)
    job = tag("failover")
    register(p, job, table, 3000, 10)
    # paced, so that the drain is in its middle when the primary stops
    p.execute("SELECT etc_batch.pace_job(%s, 1500)", (job,))
    side = tag("side")
    p.execute(sql.SQL("CREATE TABLE {} (step integer NOT NULL)").format(sql.Identifier(side)))
    batch = tag("failover_chain")
    steps = [p.execute(
        "SELECT etc_batch.add_step(%s, %s)",
        (batch, f"INSERT INTO {side} SELECT {n} FROM pg_sleep(0.03)")).fetchone()[0] for n in range(1, 81)]
    # lease generations the clients saw, each committed
    seen = []
    for holder in ("a", "b", "c"):
        row = p.execute("SELECT acquired, generation FROM etc_batch.acquire_lease('fo', %s, '1 hour')",
                        (holder,)).fetchone()
        assert row[0], row
        seen.append(row[1])
        assert p.execute("SELECT etc_batch.release_lease('fo', %s)", (holder,)).fetchone() == (True,)

    drain = Call(primary.connect(), "CALL etc_batch.drain_job(%s)", (job,))
    chain = Call(primary.connect(), "CALL etc_batch.exec_batch_from_id(%s)", (steps[0],))
    wait_until(lambda: sum(1 for n in drain.notices if n.startswith("chunk ")) >= 20
               and sum(1 for n in chain.notices if n.startswith("step ")) >= 10,
               "chunks and steps to commit")
    stop_immediately(primary)
    drain.join()
    chain.join()
    assert drain.error is not None and chain.error is not None, "the work ended before the primary stopped"
    announced_chunks = [int(n.split()[1]) for n in drain.notices if n.startswith("chunk ")]
    announced_steps = [int(n.split()[1]) for n in chain.notices if n.startswith("step ")]
    close_quietly([p])

    assert s.execute("SELECT pg_promote(true, 60)").fetchone() == (True,)
    assert s.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
    # every chunk and step whose COMMIT reached the client is there
    audited = audit_by_key(s, job)
    committed_chunks = {c for (c,) in s.execute(
        "SELECT DISTINCT chunk FROM etc_batch.job_audit WHERE job_id = %s", (job,))}
    assert set(announced_chunks) <= committed_chunks, (announced_chunks, committed_chunks)
    done_steps = {i for (i,) in s.execute(
        "SELECT id FROM etc_batch.batch_log WHERE batch = %s AND status = 'done'", (batch,))}
    assert set(announced_steps) <= done_steps, (announced_steps, done_steps)
    # nothing half-applied: changed rows are exactly the audited items, each once
    assert set(audited.values()) <= {1}
    assert {i for i, (_, status) in rows(s, table).items() if status == "cancelled"} == set(audited)
    effects = Counter(n for (n,) in s.execute(sql.SQL("SELECT step FROM {}").format(sql.Identifier(side))))
    assert set(effects.values()) <= {1}
    assert len(effects) == len(done_steps)
    assert all(ok for (ok,) in s.execute("SELECT ok FROM etc_batch.verify_job(%s)", (job,)))
    # a generation never handed out twice
    row = s.execute("SELECT acquired, generation FROM etc_batch.acquire_lease('fo', 'd', '1 hour')").fetchone()
    assert row[0] and row[1] > max(seen), (row, seen)

    # the work goes on, from where the new primary has it, and finishes exactly once
    s.execute("SELECT etc_batch.pace_job(%s, NULL)", (job,))
    assert s.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4] == "done"
    s.execute("CALL etc_batch.exec_batch_from_id(%s)", (steps[0],))
    assert audit_by_key(s, job) == Counter({i: 1 for i in range(1, 3001)})
    assert rows(s, table) == {i: (2, "cancelled") for i in range(1, 3001)}
    assert Counter(n for (n,) in s.execute(sql.SQL("SELECT step FROM {}").format(sql.Identifier(side)))) \
        == Counter(range(1, 81))
    assert all(ok for (ok,) in s.execute("SELECT ok FROM etc_batch.verify_job(%s)", (job,)))
    print(f"failover: {len(announced_chunks)} chunks and {len(announced_steps)} steps announced before the stop; "
          f"{len(committed_chunks)} chunks and {len(done_steps)} steps found on the promoted standby")
    close_quietly([s])
