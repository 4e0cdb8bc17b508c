"""Transactions sized by time (pace_job's transaction_time): consecutive chunks committed
together in one transaction, each with its own audit rows and its own move of the
checkpoint, over real connections; a backend that dies between two chunks of one
transaction or right after its commit, a row lock that times a group out, a drifted row
inside a group under on_drift stop and skip.

Which chunks shared a transaction is read from the audit: every audit row carries the
txid of the transaction that wrote it.
"""

import threading
from collections import Counter

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from conftest import JOIN, WAIT
from test_jobs import (
    Orders, assert_changed_once, assert_job_complete, assert_others_untouched,
    assert_untouched, audit_count_by_key, audit_rows, committed, drain, job_row, keys_text,
    pick_keys, postmaster_start, register, shuffled,
)


def pace(conn, job, transaction_time):
    conn.execute("SELECT etc_batch.pace_job(%s, transaction_time => %s::interval)",
                 (job, transaction_time))


def transactions(db, job):
    """The job's chunks, grouped by the transaction that committed them, in order."""
    by_txid = {}
    for r in audit_rows(db, job):
        by_txid.setdefault(r["txid"], set()).add(r["chunk"])
    return sorted((sorted(chunks) for chunks in by_txid.values()), key=lambda c: c[0])


def chunks_per_transaction(db, job):
    return db.admin.execute(
        "SELECT chunks_per_transaction FROM etc_batch.job_progress WHERE job_id = %s",
        (job,)).fetchone()["chunks_per_transaction"]


def verified(db, job):
    checks = db.admin.execute("SELECT * FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert all(c["ok"] for c in checks), checks
    return True


def a_job(db, label, count=35, chunk_size=10, seed=1):
    keys = pick_keys(seed, count, range(1, 2 * count + 10))
    orders = Orders(db, label, a_ids=range(1, 2 * count + 10))
    job = db.new_batch(label)
    register(db.connect(), job, orders.name, shuffled(orders.items(keys), seed),
             chunk_size=chunk_size)
    return keys, orders, job


def test_chunks_that_fit_the_target_commit_together_each_audited_once(db):
    keys, orders, job = a_job(db, "tt_fit")
    conn = db.connect()
    pace(conn, job, "10s")
    # max_chunks counts chunks, whatever the transactions: 3 chunks, one transaction
    assert drain(conn, job, 3) == committed(keys[:30], 3, "pending")
    assert transactions(db, job) == [[1, 2, 3]]
    assert chunks_per_transaction(db, job) == 3
    assert drain(conn, job) == committed(keys[30:], 1, "done")
    assert transactions(db, job) == [[1, 2, 3], [4]]
    assert_job_complete(db, orders, job, keys)
    assert verified(db, job)


def test_without_a_target_every_chunk_is_a_transaction(db):
    keys, orders, job = a_job(db, "tt_none")
    conn = db.connect()
    pace(conn, job, "10s")
    # pace_job sets the whole pace: a call without transaction_time clears it
    conn.execute("SELECT etc_batch.pace_job(%s)", (job,))
    assert drain(conn, job) == committed(keys, 4, "done")
    assert transactions(db, job) == [[1], [2], [3], [4]]
    assert chunks_per_transaction(db, job) == 1
    assert verified(db, job)


def crash_drain(db, job, point, max_chunks=None):
    """CALL etc_batch.drain_job under a transaction_time of 10 s, on a connection whose
    backend terminates itself at `point`; returns once that backend is gone."""
    conn = db.connect()
    conn.execute("LOAD 'etc_batch'")
    conn.execute(sql.SQL("SET etc_batch.crash_at = {}").format(sql.Literal(point)))
    pid = conn.info.backend_pid
    with pytest.raises(psycopg.OperationalError) as died:
        conn.execute("CALL etc_batch.drain_job(%s, %s::integer)", (job, max_chunks))
    assert f"terminating the backend {point}" in str(died.value), str(died.value)
    db.wait_for_exit(pid)


def test_a_backend_dying_between_two_chunks_of_a_transaction_leaves_none_of_them(db):
    started = postmaster_start(db)
    keys, orders, job = a_job(db, "tt_between", seed=2)
    pace(db.connect(), job, "10s")
    crash_drain(db, job, "between_chunks")
    db.assert_server_alive()
    # chunk 1 was done, its audit rows and checkpoint written, when the backend died
    # before chunk 2: nothing of the transaction is left
    j = job_row(db, job)
    assert (j["status"], j["next_index"], j["chunks_committed"]) == ("pending", 0, 0)
    assert audit_rows(db, job) == []
    assert_untouched(orders, keys)
    # a caller goes on from the checkpoint: every item once
    assert drain(db.connect(), job) == committed(keys, 4, "done")
    assert_job_complete(db, orders, job, keys)
    assert verified(db, job)
    assert postmaster_start(db) == started


def test_a_backend_dying_right_after_a_transaction_commits_leaves_all_of_it(db):
    keys, orders, job = a_job(db, "tt_commit", seed=3)
    pace(db.connect(), job, "10s")
    crash_drain(db, job, "after_commit", max_chunks=3)
    db.assert_server_alive()
    j = job_row(db, job)
    assert (j["status"], j["next_index"], j["chunks_committed"]) == ("pending", 30, 3)
    assert transactions(db, job) == [[1, 2, 3]]
    assert audit_count_by_key(db, job) == Counter(keys_text(keys[:30]))
    assert_changed_once(orders, keys[:30])
    assert_untouched(orders, keys[30:])
    assert drain(db.connect(), job) == committed(keys[30:], 1, "done")
    assert_job_complete(db, orders, job, keys)
    assert verified(db, job)


def test_a_lock_timeout_inside_a_transaction_runs_its_chunks_one_by_one(db):
    """Chunk 3's row is locked by the application: the transaction of chunks 1 to 3
    rolls back at the chunk's lock timeout, chunks 1 and 2 commit one per transaction,
    chunk 3 is retried alone until the lock goes, and the job ends with every item once."""
    keys, orders, job = a_job(db, "tt_lock", seed=4)
    pace(db.connect(), job, "10s")
    holder = db.connect()
    holder.autocommit = False
    orders_ident = sql.Identifier(orders.name)
    holder.execute(sql.SQL("SELECT 1 FROM {} WHERE tenant = 'A' AND id = %s FOR UPDATE")
                   .format(orders_ident), (keys[25],))

    drainer = db.connect()
    drainer.execute("SET etc_batch.chunk_lock_timeout = '100ms'")
    drainer.execute("SET etc_batch.transient_attempts = 100")
    told = debug_notices(drainer)
    outcome = {}

    def run():
        try:
            outcome["result"] = drain(drainer, job)
        except BaseException as exc:  # kept for the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # chunks 1 and 2 commit alone while chunk 3 waits for the row
    deadline = threading.Event()
    for _ in range(int(WAIT * 10)):
        if job_row(db, job)["next_index"] == 20 and db.admin.execute(
                "SELECT count(*) AS n FROM etc_batch.job_retry WHERE job_id = %s",
                (job,)).fetchone()["n"] > 0:
            break
        deadline.wait(0.1)
    assert job_row(db, job)["next_index"] == 20
    holder.rollback()
    thread.join(JOIN)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"] == committed(keys, 4, "done")
    assert any("a transaction of 2 chunk(s) and one more rolled back" in t for t in told), told
    # 1, 2 and 3 one per transaction; chunk 3's attempts recorded as retries of its own
    assert transactions(db, job)[:3] == [[1], [2], [3]]
    retried = db.admin.execute(
        "SELECT DISTINCT chunk, sqlstate FROM etc_batch.job_retry WHERE job_id = %s",
        (job,)).fetchall()
    assert [(r["chunk"], r["sqlstate"]) for r in retried] == [(3, "55P03")]
    assert_job_complete(db, orders, job, keys)
    assert verified(db, job)


def debug_notices(conn):
    """conn's messages down to DEBUG1, where a rolled-back transaction of chunks is told;
    returns the list they are kept in."""
    conn.execute("SET client_min_messages = debug1")
    told = []
    conn.add_notice_handler(lambda d: told.append(d.message_primary or ""))
    return told


def drift(orders, key):
    """The application changes the row of `key` after the approval: its revision moves."""
    orders.execute("UPDATE {t} SET revision = revision + 1, qty = qty + 100 "
                   "WHERE tenant = 'A' AND id = %s", (key,))


def test_a_drifted_row_inside_a_transaction_stops_the_job_at_its_chunk(db):
    keys, orders, job = a_job(db, "tt_stop", seed=5)
    pace(db.connect(), job, "10s")
    drift(orders, keys[25])
    conn = db.connect()
    told = debug_notices(conn)
    with pytest.raises(errors.IntegrityConstraintViolation) as conflict:
        drain(conn, job)
    assert str(keys[25]) in (conflict.value.diag.message_detail or ""), conflict.value.diag
    assert any("a transaction of 2 chunk(s) and one more rolled back" in t for t in told), told
    # what the job says is as it would be without a target: chunks 1 and 2 committed
    # (alone, after the rollback), chunk 3 in conflict
    j = job_row(db, job)
    assert (j["status"], j["next_index"]) == ("conflict", 20)
    assert j["problem"]["key"] == str(keys[25])
    assert transactions(db, job) == [[1], [2]]
    assert audit_count_by_key(db, job) == Counter(keys_text(keys[:20]))
    assert_changed_once(orders, keys[:20])
    assert_untouched(orders, [k for k in keys[20:] if k != keys[25]])


def test_a_drifted_row_inside_a_transaction_is_skipped_under_on_drift_skip(db):
    keys = pick_keys(7, 35, range(1, 80))
    orders = Orders(db, "tt_skip", a_ids=range(1, 80))
    job = db.new_batch("tt_skip")
    db.connect().execute(
        "SELECT * FROM etc_batch.register_job(job_id => %s, tenant => 'A', target => %s::regclass, "
        "items => %s::jsonb, chunk_size => 10, set_values => '{\"status\": \"cancelled\"}', "
        "expect => '{\"status\": \"pending\"}', on_drift => 'skip')",
        (job, orders.name, Jsonb(orders.items(keys))))
    pace(db.connect(), job, "10s")
    drift(orders, keys[25])
    conn = db.connect()
    told = debug_notices(conn)
    result = drain(conn, job)
    assert (result["committed_chunks"], result["committed_items"], result["status"]) == (4, 35, "done")
    # a skip is the chunk's own business: nothing rolled back, one transaction
    assert not any("rolled back" in t for t in told), told
    assert transactions(db, job) == [[1, 2, 3, 4]]
    assert chunks_per_transaction(db, job) == 4
    skipped = db.admin.execute(
        "SELECT item_key FROM etc_batch.job_audit_items WHERE job_id = %s AND outcome = 'skipped'",
        (job,)).fetchall()
    assert [r["item_key"] for r in skipped] == [str(keys[25])]
    assert_changed_once(orders, [k for k in keys if k != keys[25]])
    assert_others_untouched(orders, keys)
    assert verified(db, job)


@pytest.mark.parametrize("value", ["0", "-1 second", "2 hours"])
def test_a_transaction_time_out_of_range_is_refused(db, value):
    keys, orders, job = a_job(db, "tt_range", count=5, seed=8)
    with pytest.raises(errors.InvalidParameterValue):
        pace(db.connect(), job, value)
    with pytest.raises(errors.InvalidParameterValue):
        db.connect().execute(
            "SELECT etc_batch.pace_job(%s, rows_per_second => 100, transaction_time => '1s')", (job,))
    assert db.admin.execute("SELECT count(*) AS n FROM etc_batch.job_pace WHERE job_id = %s",
                            (job,)).fetchone()["n"] == 0


def test_two_drainers_of_a_parallel_job_group_the_chunks_they_claim(db):
    universe = range(1, 401)
    keys = pick_keys(9, 300, universe)
    orders = Orders(db, "tt_par", a_ids=universe)
    job = db.new_batch("tt_par")
    register(db.connect(), job, orders.name, orders.items(keys), parallel=True)
    pace(db.connect(), job, "10s")
    barrier = threading.Barrier(2)
    results, failures = [], []

    def run():
        try:
            conn = db.connect()
            barrier.wait(WAIT)
            results.append(drain(conn, job))
        except BaseException as exc:  # kept for the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN)
    assert failures == []
    assert sum(r["committed_chunks"] for r in results) == 30
    groups = transactions(db, job)
    assert sorted(c for g in groups for c in g) == list(range(1, 31))
    assert max(len(g) for g in groups) > 1, groups
    assert chunks_per_transaction(db, job) >= 1
    assert_job_complete(db, orders, job, keys)
    assert verified(db, job)
