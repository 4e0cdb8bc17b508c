"""Checkpointed jobs driven by clients: etc_batch.register_job and
CALL etc_batch.drain_job over real connections, with conflicting operators, backends
that die at each point of a chunk, lost replies, concurrent drainers, tampered
progress, bad registrations, handler jobs and roles.

Every outcome is checked on the business table itself (each order's revision against
the revision it had when the approval was taken) and on the audit rows counted per
key, not only on what etc_batch reports about itself.
"""

import random
import secrets
import threading
from collections import Counter
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from conftest import JOIN, WAIT

CANCEL = {"status": "cancelled"}
PENDING = {"status": "pending"}


# helpers ----------------------------------------------------------------------------------


class Orders:
    """A business table orders(tenant, id, revision, qty, status) of one test, with
    tenant A's rows at varied initial revisions and tenant B's rows (same ids) all at
    revision 1. `initial` is the table as created: (tenant, id) -> (revision, qty, status).
    """

    def __init__(self, db, label, a_ids, b_ids=(), primary_key=True):
        self.db = db
        self.name = f"orders_{label}_{secrets.token_hex(3)}"
        self.ident = sql.Identifier(self.name)
        pk = ", PRIMARY KEY (tenant, id)" if primary_key else ""
        db.admin.execute(
            sql.SQL(
                "CREATE TABLE {} (tenant text NOT NULL, id integer NOT NULL, "
                "revision integer NOT NULL, qty integer, status text NOT NULL" + pk + ")"
            ).format(self.ident)
        )
        rows = [("A", i, 1 + i % 4, 1 + i % 9, "pending") for i in a_ids]
        rows += [("B", i, 1, 1 + i % 9, "pending") for i in b_ids]
        with db.admin.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (tenant, id, revision, qty, status) VALUES (%s, %s, %s, %s, %s)"
                ).format(self.ident),
                rows,
            )
        self.initial = self.snapshot()

    def snapshot(self):
        rows = self.db.admin.execute(
            sql.SQL("SELECT tenant, id, revision, qty, status FROM {}").format(self.ident)
        ).fetchall()
        return {(r["tenant"], r["id"]): (r["revision"], r["qty"], r["status"]) for r in rows}

    def items(self, keys, tenant="A"):
        """The approval an operator would take now: key, revision and qty as a guard."""
        out = []
        for k in keys:
            revision, qty, _ = self.initial[(tenant, k)]
            out.append({"id": k, "revision": revision, "qty": qty})
        return out

    def execute(self, statement, params=()):
        """Runs statement with {t} standing for this table."""
        return self.db.admin.execute(sql.SQL(statement).format(t=self.ident), params)


@contextmanager
def keeping_notices(conn, notices):
    """Appends the primary message of every notice conn receives to notices (a list),
    while the block runs; nothing when notices is None."""
    if notices is None:
        yield
        return

    def keep(diag):
        notices.append(diag.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        yield
    finally:
        conn.remove_notice_handler(keep)


def register(conn, job, target, items, chunk_size=10, tenant="A", set_values=CANCEL,
             expect=PENDING, handler=None, notices=None, parallel=None):
    """SELECT * FROM etc_batch.register_job(...) with named arguments; returns its row
    as a dict. expect=None leaves the default; items/set_values go as jsonb."""
    args = [
        sql.SQL("job_id => %s"),
        sql.SQL("tenant => %s"),
        sql.SQL("target => %s::regclass"),
        sql.SQL("items => %s::jsonb"),
        sql.SQL("chunk_size => %s"),
        sql.SQL("set_values => %s::jsonb"),
    ]
    params = [
        job,
        tenant,
        target,
        None if items is None else Jsonb(items),
        chunk_size,
        None if set_values is None else Jsonb(set_values),
    ]
    if expect is not None:
        args.append(sql.SQL("expect => %s::jsonb"))
        params.append(Jsonb(expect))
    if handler is not None:
        args.append(sql.SQL("handler => %s::regprocedure"))
        params.append(handler)
    if parallel is not None:
        args.append(sql.SQL("parallel => %s"))
        params.append(parallel)
    with keeping_notices(conn, notices):
        cur = conn.cursor(row_factory=dict_row)
        return cur.execute(
            sql.SQL("SELECT * FROM etc_batch.register_job({})").format(sql.SQL(", ").join(args)),
            params,
        ).fetchone()


def drain(conn, job, max_chunks=None, notices=None):
    """CALL etc_batch.drain_job(job, max_chunks) on conn; returns its result row as a
    dict (committed_chunks, committed_items, first_key, last_key, status). Errors
    propagate."""
    with keeping_notices(conn, notices):
        cur = conn.cursor(row_factory=dict_row)
        return cur.execute(
            "CALL etc_batch.drain_job(%s, %s::integer)", (job, max_chunks)
        ).fetchone()


def job_row(db, job):
    return db.admin.execute(
        """SELECT job_id, status, next_index, item_count, chunk_size, chunks_committed,
                  audit_changes, item_changes, problem, status_reason,
                  registered_by::text AS registered_by, registered_at, job_number
             FROM etc_batch.job WHERE job_id = %s""",
        (job,),
    ).fetchone()


def job_items(db, job):
    return db.admin.execute(
        "SELECT position, item_key, revision, guards FROM etc_batch.job_item "
        "WHERE job_id = %s ORDER BY position",
        (job,),
    ).fetchall()


def audit_rows(db, job):
    return db.admin.execute(
        """SELECT position, item_key, revision_before, revision_after, guards, chunk, txid,
                  committed_at
             FROM etc_batch.job_audit_items WHERE job_id = %s ORDER BY position""",
        (job,),
    ).fetchall()


def audit_count_by_key(db, job):
    return Counter(r["item_key"] for r in audit_rows(db, job))


def postmaster_start(db):
    return db.admin.execute("SELECT pg_postmaster_start_time() AS t").fetchone()["t"]


def chunk_notice(number, total, keys):
    noun = "item" if len(keys) == 1 else "items"
    return f"chunk {number} of {total} committed: {len(keys)} {noun}, keys {keys[0]} to {keys[-1]}"


def committed(keys, chunks, status):
    """drain_job's result for a call that committed `keys`, in `chunks` chunks."""
    keys = keys_text(keys)
    return {"committed_chunks": chunks, "committed_items": len(keys),
            "first_key": keys[0] if keys else None, "last_key": keys[-1] if keys else None,
            "status": status}


def keys_text(keys):
    return [str(k) for k in keys]


def pick_keys(seed, count, universe):
    """count distinct ids out of universe, sorted numerically, with gaps between them."""
    rng = random.Random(seed)
    return sorted(rng.sample(list(universe), count))


def shuffled(items, seed):
    out = list(items)
    random.Random(seed).shuffle(out)
    return out


def assert_changed_once(orders, keys, tenant="A"):
    """Each key's row carries exactly one change by the job: status cancelled and the
    revision one above the approved one, qty untouched."""
    now = orders.snapshot()
    for k in keys:
        revision, qty, _ = orders.initial[(tenant, k)]
        assert now[(tenant, k)] == (revision + 1, qty, "cancelled"), (k, now[(tenant, k)])


def assert_untouched(orders, keys, tenant="A"):
    now = orders.snapshot()
    for k in keys:
        assert now[(tenant, k)] == orders.initial[(tenant, k)], (tenant, k, now[(tenant, k)])


def assert_others_untouched(orders, approved, tenant="A"):
    """Every row that is not an approved (tenant, key) is as it was created."""
    approved = {(tenant, k) for k in approved}
    now = orders.snapshot()
    assert set(now) == set(orders.initial)
    for row, values in orders.initial.items():
        if row not in approved:
            assert now[row] == values, (row, now[row])


def assert_job_complete(db, orders, job, keys):
    """The job is done, every approved key has exactly one audit row whose revisions
    agree with the row, and no other row of the table changed."""
    assert audit_count_by_key(db, job) == Counter(keys_text(keys))
    assert_changed_once(orders, keys)
    assert_others_untouched(orders, keys)
    for r in audit_rows(db, job):
        revision = orders.initial[("A", int(r["item_key"]))][0]
        assert (r["revision_before"], r["revision_after"]) == (revision, revision + 1), r
    j = job_row(db, job)
    assert (j["status"], j["next_index"]) == ("done", len(keys)), j


def crash_drain(db, job, point):
    """CALL etc_batch.drain_job(job, 1) on a connection of its own whose backend
    terminates itself at `point` of the chunk; returns once that backend is gone."""
    conn = db.connect()
    conn.execute("LOAD 'etc_batch'")
    conn.execute(sql.SQL("SET etc_batch.crash_at = {}").format(sql.Literal(point)))
    pid = conn.info.backend_pid
    with pytest.raises(psycopg.OperationalError) as died:
        conn.execute("CALL etc_batch.drain_job(%s, 1)", (job,))
    # the backend ended where it was told to, not for another reason
    assert f"terminating the backend {point}" in str(died.value), str(died.value)
    assert conn.closed or conn.broken
    db.wait_for_exit(pid)


class Drainer:
    """CALL etc_batch.drain_job(job) in a thread of its own, on a connection of its
    own, released by a barrier; keeps the result row, the notices and the error."""

    def __init__(self, db, job, barrier):
        self.conn = db.connect()
        self.pid = self.conn.info.backend_pid
        self.job = job
        self.barrier = barrier
        self.notices = []
        self.result = None
        self.error = None
        self.thread = threading.Thread(target=self._run, name=f"drain_job-{self.pid}", daemon=True)

    def _run(self):
        try:
            self.barrier.wait(WAIT)
            self.result = drain(self.conn, self.job, notices=self.notices)
        except BaseException as exc:  # kept for the test to assert on
            self.error = exc

    def start(self):
        self.thread.start()
        return self

    def join(self):
        self.thread.join(JOIN)
        assert not self.thread.is_alive(), f"drain_job in backend {self.pid} did not return"
        return self


class ProgressObserver:
    """Polls a job's checkpoint and audit rows, each poll one statement and so one
    snapshot, until stopped; keeps (next_index, audit rows, 1 + highest audited
    position, highest audited chunk) of every poll, and, given the drainers' backends,
    how many of them were waiting for a lock at each poll."""

    QUERY = """
        SELECT j.next_index,
               (SELECT count(*) FROM etc_batch.job_audit a WHERE a.job_id = j.job_id),
               (SELECT coalesce(max(a.position) + 1, 0) FROM etc_batch.job_audit a
                 WHERE a.job_id = j.job_id),
               (SELECT coalesce(max(a.chunk), 0) FROM etc_batch.job_audit a
                 WHERE a.job_id = j.job_id)
          FROM etc_batch.job j WHERE j.job_id = %s"""

    WAITING = """
        SELECT count(*) FROM pg_catalog.pg_stat_activity
         WHERE pid = ANY(%s) AND wait_event_type = 'Lock'"""

    def __init__(self, db, job, barrier, pids=()):
        self.conn = db.connect()
        self.job = job
        self.barrier = barrier
        self.pids = list(pids)
        self.seen = []
        self.waiting = []
        self.error = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="progress-observer", daemon=True)

    def _run(self):
        try:
            self.barrier.wait(WAIT)
            while True:
                last = self.done.is_set()
                self.seen.append(tuple(self.conn.execute(self.QUERY, (self.job,)).fetchone()))
                if self.pids:
                    self.waiting.append(self.conn.execute(self.WAITING, (self.pids,)).fetchone()[0])
                if last:
                    break
        except BaseException as exc:  # kept for the test to assert on
            self.error = exc

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.done.set()
        self.thread.join(JOIN)
        assert not self.thread.is_alive(), "the progress observer did not stop"


# 1. the seed scenario ---------------------------------------------------------------------


def test_seed_scenario_conflict_keeps_committed_chunks_and_reports_drift(db):
    universe = range(1, 200)
    keys = pick_keys(20240611, 37, universe)
    assert any(b - a > 1 for a, b in zip(keys, keys[1:])), "keys must have gaps"
    # keys of one, two and three digits: text order differs from numeric order
    assert keys[0] < 10 and keys[-1] >= 100
    orders = Orders(db, "seed", a_ids=universe, b_ids=universe)
    job = db.new_batch("seed")
    items = orders.items(keys)

    conn = db.connect()
    first = register(conn, job, orders.name, shuffled(items, 1))
    assert first == {"job_id": job, "created": True, "items": 37, "chunks": 4}
    frozen = job_items(db, job)
    assert [r["position"] for r in frozen] == list(range(37))
    assert [r["item_key"] for r in frozen] == keys_text(keys)
    for r, k in zip(frozen, keys):
        revision, qty, _ = orders.initial[("A", k)]
        assert (r["revision"], r["guards"]) == (revision, {"qty": qty})
    registered_at = job_row(db, job)["registered_at"]

    # the same approval in another order: recognised, nothing changes
    notices = []
    again = register(conn, job, orders.name, shuffled(items, 2), notices=notices)
    assert again == {"job_id": job, "created": False, "items": 37, "chunks": 4}
    assert any("already registered" in n for n in notices), notices
    assert job_items(db, job) == frozen
    assert job_row(db, job)["registered_at"] == registered_at

    # one qty changed: refused, naming the key
    changed_key = keys[22]
    altered = [dict(i) for i in shuffled(items, 3)]
    for i in altered:
        if i["id"] == changed_key:
            i["qty"] += 1
    with pytest.raises(errors.DuplicateObject) as refused:
        register(conn, job, orders.name, altered)
    assert refused.value.sqlstate == "42710"
    diag = refused.value.diag
    assert f"Item {changed_key} " in (diag.message_detail or ""), diag.message_detail
    assert job_items(db, job) == frozen

    # one chunk: the 10 smallest keys, numerically
    notices = []
    result = drain(conn, job, 1, notices=notices)
    assert result == committed(keys[:10], 1, "pending")
    assert notices == [chunk_notice(1, 4, keys[:10])]
    assert_changed_once(orders, keys[:10])
    assert_untouched(orders, keys[10:])
    assert audit_count_by_key(db, job) == Counter(keys_text(keys[:10]))

    # another operator changes the 15th item (the 5th of chunk 2)
    contested = keys[14]
    orders.execute(
        "UPDATE {t} SET qty = qty + 1, revision = revision + 1 WHERE tenant = 'A' AND id = %s",
        (contested,),
    )
    with pytest.raises(errors.IntegrityConstraintViolation) as conflict:
        drain(conn, job)
    assert conflict.value.sqlstate == "23000"
    assert str(contested) in (conflict.value.diag.message_detail or ""), conflict.value.diag

    def check_after_conflict():
        now = orders.snapshot()
        # chunk 1 stays committed, once
        assert_changed_once(orders, keys[:10])
        # items 11 to 14 and 16 to 20 of the rolled-back chunk: unchanged
        assert_untouched(orders, keys[10:14] + keys[15:])
        # item 15 holds the other operator's change, not the job's
        revision, qty, _ = orders.initial[("A", contested)]
        assert now[("A", contested)] == (revision + 1, qty + 1, "pending")
        # tenant B, same ids: untouched, all pending at revision 1
        b_rows = {k: v for k, v in now.items() if k[0] == "B"}
        assert len(b_rows) == len(universe)
        assert all(v[0] == 1 and v[2] == "pending" for v in b_rows.values())
        assert_others_untouched(orders, keys[:10] + [contested])
        assert audit_count_by_key(db, job) == Counter(keys_text(keys[:10]))
        j = job_row(db, job)
        assert (j["status"], j["next_index"], j["chunks_committed"]) == ("conflict", 10, 1)
        assert j["status_reason"]
        assert j["problem"]["key"] == str(contested) and j["problem"]["position"] == 14

    check_after_conflict()
    # a job in conflict stays stopped
    with pytest.raises(errors.IntegrityConstraintViolation) as again_conflict:
        drain(db.connect(), job)
    assert again_conflict.value.sqlstate == "23000"
    check_after_conflict()

    # the committed rows drift: one deleted, one changed again
    gone, drifted = keys[3], keys[6]
    orders.execute("DELETE FROM {t} WHERE tenant = 'A' AND id = %s", (gone,))
    orders.execute(
        "UPDATE {t} SET revision = revision + 1 WHERE tenant = 'A' AND id = %s", (drifted,)
    )
    report = db.admin.execute(
        "SELECT * FROM etc_batch.job_report(%s) ORDER BY position", (job,)
    ).fetchall()
    assert [r["position"] for r in report] == list(range(37))
    assert [r["item_key"] for r in report] == keys_text(keys)
    for r, k in zip(report, keys):
        revision = orders.initial[("A", k)][0]
        if k == gone:
            assert (r["state"], r["revision_committed"], r["revision_now"]) == (
                "missing", revision + 1, None)
        elif k == drifted:
            assert (r["state"], r["revision_committed"], r["revision_now"]) == (
                "drifted", revision + 1, revision + 2)
        elif r["position"] < 10:
            assert (r["state"], r["revision_committed"], r["revision_now"]) == (
                "matching", revision + 1, revision + 1)
        else:
            assert r["state"] == "unprocessed" and r["revision_committed"] is None, r
    states = Counter(r["state"] for r in report)
    assert states == {"matching": 8, "drifted": 1, "missing": 1, "unprocessed": 27}
    summary = db.admin.execute("SELECT * FROM etc_batch.job_summary(%s)", (job,)).fetchone()
    assert summary == {
        "status": "conflict",
        "approved": 37,
        "committed": 10,
        "unprocessed": 27,
        "matching": 8,
        "drifted": 1,
        "missing": 1,
        "parallel": False,
        "skipped": 0,
        "failed_at": None,
        "failure_sqlstate": None,
        "failure_message": None,
    }


# 2. a backend that dies at each point of a chunk ------------------------------------------


# after the change; after the audit rows and the checkpoint, one statement; after COMMIT
CRASH_POINTS = ["after_change", "after_checkpoint", "after_commit"]


def test_dense_and_sparse_chunks_change_each_row_once_and_see_drift(db):
    # Chunks under 200 items share a plan made once: one that reads the chunk's key range
    # when its items are most of the keys in it, one that probes the key's index once
    # per item when they are not (test_a_large_chunk_reads_its_dense_range_once_...
    # shows the plans). Either way every approved row changes once, with its audit, and
    # a row that no longer matches its approval is a conflict.
    universe = range(1, 701)
    orders = Orders(db, "dense", a_ids=universe, b_ids=universe)
    dense_keys = list(range(1, 201))
    sparse_keys = list(range(301, 701, 4))
    conn = db.connect()
    dense_job, sparse_job = db.new_batch("dense"), db.new_batch("sparse")
    register(conn, dense_job, orders.name, orders.items(dense_keys), chunk_size=100)
    register(conn, sparse_job, orders.name, orders.items(sparse_keys), chunk_size=100)
    # another operator changes key 150, the 50th item of the dense job's second chunk
    orders.execute(
        "UPDATE {t} SET qty = qty + 1, revision = revision + 1 WHERE tenant = 'A' AND id = 150")

    assert drain(conn, dense_job, 1) == committed(dense_keys[:100], 1, "pending")
    with pytest.raises(errors.IntegrityConstraintViolation) as conflict:
        drain(conn, dense_job)
    assert "150" in (conflict.value.diag.message_detail or ""), conflict.value.diag
    j = job_row(db, dense_job)
    assert (j["status"], j["next_index"], j["chunks_committed"]) == ("conflict", 100, 1)
    assert j["problem"]["key"] == "150"
    assert drain(conn, sparse_job) == committed(sparse_keys, 1, "done")

    assert_changed_once(orders, dense_keys[:100] + sparse_keys)
    assert_untouched(orders, dense_keys[100:149] + dense_keys[150:])
    assert_others_untouched(orders, dense_keys[:100] + sparse_keys + [150])
    assert audit_count_by_key(db, dense_job) == Counter(keys_text(dense_keys[:100]))
    assert audit_count_by_key(db, sparse_job) == Counter(keys_text(sparse_keys))


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_backend_dying_mid_chunk_leaves_chunk_whole_or_absent(db, point):
    started = postmaster_start(db)
    keys = pick_keys(40 + CRASH_POINTS.index(point), 35, range(1, 80))
    orders = Orders(db, "crash", a_ids=range(1, 80), b_ids=range(1, 80))
    job = db.new_batch(f"crash_{point}")
    register(db.connect(), job, orders.name, shuffled(orders.items(keys), 7))

    assert drain(db.connect(), job, 1) == committed(keys[:10], 1, "pending")
    crash_drain(db, job, point)
    db.assert_server_alive()

    chunk2 = keys[10:20]
    j = job_row(db, job)
    if point == "after_commit":
        # the chunk committed before the backend died: all of it
        assert_changed_once(orders, keys[:20])
        assert_untouched(orders, keys[20:])
        assert audit_count_by_key(db, job) == Counter(keys_text(keys[:20]))
        assert [r["chunk"] for r in audit_rows(db, job)][10:] == [2] * 10
        assert (j["status"], j["next_index"], j["chunks_committed"]) == ("pending", 20, 2)
    else:
        # nothing of the chunk survived
        assert_changed_once(orders, keys[:10])
        assert_untouched(orders, keys[10:])
        assert audit_count_by_key(db, job) == Counter(keys_text(keys[:10]))
        assert not any(r["chunk"] == 2 for r in audit_rows(db, job))
        assert (j["status"], j["next_index"], j["chunks_committed"]) == ("pending", 10, 1)
    assert j["audit_changes"] == 0 and j["item_changes"] == 0
    assert_others_untouched(orders, keys)

    # a normal caller resumes where the checkpoint says
    resumed = drain(db.connect(), job)
    rest = keys[20:] if point == "after_commit" else chunk2 + keys[20:]
    assert resumed == committed(rest, len(rest) // 10 + 1, "done")
    assert_job_complete(db, orders, job, keys)
    assert all(c["ok"] for c in db.admin.execute(
        "SELECT * FROM etc_batch.verify_job(%s)", (job,)).fetchall())
    # the backend ended itself with FATAL: no crash, no restart of the server
    assert postmaster_start(db) == started


# 3. a lost reply --------------------------------------------------------------------------


def test_lost_reply_after_commit_is_not_replayed(db):
    started = postmaster_start(db)
    keys = pick_keys(99, 35, range(1, 60))
    orders = Orders(db, "lostreply", a_ids=range(1, 60), b_ids=range(1, 60))
    job = db.new_batch("lostreply")
    register(db.connect(), job, orders.name, shuffled(orders.items(keys), 4))
    drain(db.connect(), job, 1)

    # chunk 2 commits, then the connection dies before the reply reaches the client
    crash_drain(db, job, "after_commit")

    # the client, not knowing, calls again: it gets chunk 3, never chunk 2 again
    notices = []
    retry = drain(db.connect(), job, 1, notices=notices)
    assert retry == committed(keys[20:30], 1, "pending")
    assert notices == [chunk_notice(3, 4, keys[20:30])]
    audit = audit_rows(db, job)
    assert audit_count_by_key(db, job) == Counter(keys_text(keys[:30]))
    by_chunk = {}
    for r in audit:
        by_chunk.setdefault(r["chunk"], set()).add(r["txid"])
    assert sorted(by_chunk) == [1, 2, 3]
    assert all(len(t) == 1 for t in by_chunk.values()), by_chunk
    assert len({next(iter(t)) for t in by_chunk.values()}) == 3
    # chunk 2's rows were changed exactly once
    assert_changed_once(orders, keys[:30])
    assert_untouched(orders, keys[30:])

    drain(db.connect(), job)
    assert_job_complete(db, orders, job, keys)
    assert postmaster_start(db) == started


# 4. concurrent drainers -------------------------------------------------------------------


def drain_concurrently(db, callers, label):
    """A job of 200 approved items in 20 chunks of 10, drained to the end by `callers`
    concurrent CALLs released together, watched by a ProgressObserver."""
    universe = range(1, 301)
    keys = pick_keys(callers, 200, universe)
    orders = Orders(db, label, a_ids=universe, b_ids=range(1, 50))
    job = db.new_batch(label)
    assert register(db.connect(), job, orders.name, shuffled(orders.items(keys), 5))["chunks"] == 20
    # a chunk takes at least 20 ms, so that the other callers are waiting for the job's
    # row while one commits a chunk, long before the first one could finish alone
    db.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(0.02); RETURN NULL; END $$"
    ).format(fn=sql.Identifier(f"{label}_slow")))
    orders.execute(sql.SQL(
        "CREATE TRIGGER slow AFTER UPDATE ON {{t}} FOR EACH STATEMENT EXECUTE FUNCTION {fn}()"
    ).format(fn=sql.Identifier(f"{label}_slow")).as_string(db.admin))

    barrier = threading.Barrier(callers + 1)
    drainers = [Drainer(db, job, barrier) for _ in range(callers)]
    for d in drainers:
        d.start()
    observer = ProgressObserver(db, job, barrier, [d.pid for d in drainers]).start()
    for d in drainers:
        d.join()
    observer.stop()
    return keys, orders, job, drainers, observer


def audit_by_chunk(db, job):
    """chunk -> (its one txid, its one committed_at); fails if a chunk has more."""
    txids, stamps = {}, {}
    for r in audit_rows(db, job):
        txids.setdefault(r["chunk"], set()).add(r["txid"])
        stamps.setdefault(r["chunk"], set()).add(r["committed_at"])
    assert all(len(t) == 1 for t in txids.values()), txids
    assert all(len(s) == 1 for s in stamps.values()), stamps
    return {c: (next(iter(txids[c])), next(iter(stamps[c]))) for c in txids}


@pytest.mark.parametrize("callers", [2, 8])
def test_concurrent_drainers_commit_each_chunk_once(db, callers):
    keys, orders, job, drainers, observer = drain_concurrently(db, callers, f"conc{callers}")
    for d in drainers:
        assert d.error is None, f"drainer {d.pid}: {d.error!r}"
        assert d.result["status"] == "done", d.result

    # the chunks each caller says it committed (a NOTICE each) partition the approval,
    # and its result counts them
    mine_of = {}
    for d in drainers:
        mine = [int(n.split()[1]) for n in d.notices if n.startswith("chunk ")]
        mine_of[d.pid] = mine
        chunk_keys = [k for c in sorted(mine) for k in keys[(c - 1) * 10:c * 10]]
        assert d.result == committed(chunk_keys, len(mine), "done"), (d.result, mine)
    every = sorted(c for mine in mine_of.values() for c in mine)
    assert every == list(range(1, 21)), every
    assert sum(d.result["committed_items"] for d in drainers) == 200
    # the callers really ran at once: while one committed a chunk, others waited for the
    # job's row. (Which of them then takes the next chunk is the scheduler's choice: the
    # one that just committed often takes it again, so how many callers committed chunks
    # proves nothing either way.)
    assert max(observer.waiting, default=0) >= 1, observer.waiting

    assert_job_complete(db, orders, job, keys)
    j = job_row(db, job)
    assert j["chunks_committed"] == 20

    # each chunk committed in exactly one transaction, a different one for each chunk
    audit = audit_rows(db, job)
    for r in audit:
        assert r["chunk"] == r["position"] // 10 + 1, r
    chunks = audit_by_chunk(db, job)
    assert sorted(chunks) == list(range(1, 21))
    assert len({txid for txid, _ in chunks.values()}) == 20, chunks

    # chunks became visible strictly in order: every snapshot taken while the drainers
    # ran saw a checkpoint at a chunk boundary with exactly the audit rows below it
    assert observer.error is None, repr(observer.error)
    seen = observer.seen
    assert any(0 < s[0] < 200 for s in seen), ("the observer saw no checkpoint mid-job", seen)
    for next_index, audits, top, last_chunk in seen:
        assert next_index % 10 == 0 and audits == top == next_index, seen
        assert last_chunk == next_index // 10, seen
    assert [s[0] for s in seen] == sorted(s[0] for s in seen), seen

    # each caller's own chunks, one transaction after the other: increasing chunk
    # numbers, txids and committed_at
    for d in drainers:
        mine = mine_of[d.pid]
        assert mine == sorted(mine), (d.pid, mine)
        ids = [chunks[c][0] for c in mine]
        assert ids == sorted(ids), (d.pid, mine, ids)
        times = [chunks[c][1] for c in mine]
        assert times == sorted(times) and len(set(times)) == len(times), (d.pid, times)
        # and was told about each chunk it committed
        told = [n for n in d.notices if n.startswith("chunk ")]
        assert told == [
            chunk_notice(c, 20, keys_text(keys[(c - 1) * 10:c * 10])) for c in mine
        ]


@pytest.mark.parametrize("callers", [2, 8])
def test_audit_records_concurrent_chunks_in_commit_order(db, callers):
    keys, orders, job, drainers, _ = drain_concurrently(db, callers, f"order{callers}")
    for d in drainers:
        assert d.error is None, f"drainer {d.pid}: {d.error!r}"
    assert_job_complete(db, orders, job, keys)
    chunks = audit_by_chunk(db, job)
    assert sorted(chunks) == list(range(1, 21))

    # Chunk k + 1 is committed only after chunk k: its transaction reads chunk k's
    # checkpoint under the job's row lock. So the audit must show chunk k + 1 with a
    # later txid and a later committed_at than chunk k.
    # This holds because a drainer asks for its transaction id only when it locks the
    # job's row, after any wait, and stamps committed_at after the lock too.
    by_chunk = [(c, chunks[c][0], chunks[c][1].isoformat()) for c in range(1, 21)]
    txids = [chunks[c][0] for c in range(1, 21)]
    stamps = [chunks[c][1] for c in range(1, 21)]
    assert txids == sorted(txids), ("audit txids do not increase with the chunk number", by_chunk)
    assert stamps == sorted(stamps) and len(set(stamps)) == 20, (
        "audit committed_at does not increase with the chunk number", by_chunk)


# 5. tampered progress ---------------------------------------------------------------------


def tamper_delete_audit_row(db, job, keys):
    """The audit row of the first chunk (positions 0 to 9) removed."""
    db.admin.execute(
        "DELETE FROM etc_batch.job_audit_chunk WHERE job_id = %s AND first_position = 0", (job,)
    )


def tamper_mid_chunk(db, job, keys):
    db.admin.execute("UPDATE etc_batch.job SET next_index = 15 WHERE job_id = %s", (job,))


def tamper_past_end(db, job, keys):
    db.admin.execute(
        "UPDATE etc_batch.job SET next_index = item_count + 10 WHERE job_id = %s", (job,)
    )


def tamper_insert_foreign_audit_row(db, job, keys):
    db.admin.execute(
        """INSERT INTO etc_batch.job_audit_chunk
             (job_id, first_position, last_position, chunk, txid, committed_at, revisions_after)
           VALUES (%s, 20, 20, 3, txid_current(), now(), '{2}')""",
        (job,),
    )


def tamper_rewrite_audit_row(db, job, keys):
    """The revision after of position 12 forged inside the second chunk's row."""
    db.admin.execute(
        "UPDATE etc_batch.job_audit_chunk SET revisions_after[3] = 99"
        " WHERE job_id = %s AND first_position = 10",
        (job,),
    )


TAMPERING = {
    "delete_audit_row": tamper_delete_audit_row,
    "next_index_mid_chunk": tamper_mid_chunk,
    "next_index_past_end": tamper_past_end,
    "foreign_audit_row_at_checkpoint": tamper_insert_foreign_audit_row,
    "audit_row_rewritten": tamper_rewrite_audit_row,
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_tampered_progress_is_refused_and_nothing_changes(db, case):
    keys = pick_keys(len(case), 35, range(1, 70))
    orders = Orders(db, "tamper", a_ids=range(1, 70), b_ids=range(1, 20))
    job = db.new_batch(f"tamper_{case}")
    register(db.connect(), job, orders.name, shuffled(orders.items(keys), 6))
    assert drain(db.connect(), job, 2)["committed_chunks"] == 2
    assert_changed_once(orders, keys[:20])

    TAMPERING[case](db, job, keys)
    business = orders.snapshot()
    audit = audit_rows(db, job)
    next_index = job_row(db, job)["next_index"]

    with pytest.raises(errors.DataCorrupted) as refused:
        drain(db.connect(), job)
    assert refused.value.sqlstate == "XX001"

    def check_nothing_changed():
        assert orders.snapshot() == business
        assert audit_rows(db, job) == audit
        j = job_row(db, job)
        assert (j["status"], j["next_index"]) == ("corrupt", next_index), j
        assert j["status_reason"]

    check_nothing_changed()
    with pytest.raises(errors.DataCorrupted) as again:
        drain(db.connect(), job, 1)
    assert again.value.sqlstate == "XX001"
    check_nothing_changed()

    checks = db.admin.execute("SELECT * FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert any(not c["ok"] for c in checks), checks
    check_nothing_changed()


def test_verify_job_marks_a_tampered_pending_job_corrupt(db):
    keys = pick_keys(5, 25, range(1, 40))
    orders = Orders(db, "verify", a_ids=range(1, 40))
    job = db.new_batch("verify")
    register(db.connect(), job, orders.name, orders.items(keys))
    drain(db.connect(), job, 1)

    clean = db.admin.execute("SELECT * FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert clean and all(c["ok"] for c in clean), clean
    assert job_row(db, job)["status"] == "pending"

    tamper_delete_audit_row(db, job, keys)
    checks = db.admin.execute("SELECT * FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    failed = {c["check_name"] for c in checks if not c["ok"]}
    assert failed, checks
    assert job_row(db, job)["status"] == "corrupt"
    before = orders.snapshot()
    with pytest.raises(errors.DataCorrupted):
        drain(db.connect(), job)
    assert orders.snapshot() == before
    assert_untouched(orders, keys[10:])


# 6. bad registrations ---------------------------------------------------------------------


BAD_REGISTRATIONS = {
    # label: (changes to the good request, SQLSTATE, what the message must name)
    "duplicate_keys": (
        {"items": [{"id": 3, "revision": 1}, {"id": 3, "revision": 1}]}, "22023", "Key 3"),
    "string_key_for_int_key": ({"items": [{"id": "3", "revision": 1}]}, "22023", "key"),
    "guard_of_wrong_type": (
        {"items": [{"id": 3, "revision": 1, "qty": "two"}]}, "22023", '"qty"'),
    "chunk_size_zero": ({"chunk_size": 0}, "22023", "chunk size 0"),
    "unknown_guard_column": (
        {"items": [{"id": 3, "revision": 1, "colour": "red"}]}, "42703", '"colour"'),
    "unknown_set_column": ({"set_values": {"colour": "red"}}, "42703", '"colour"'),
    "set_values_assigns_id": ({"set_values": {"status": "cancelled", "id": 9}}, "22023", '"id"'),
    "set_values_assigns_tenant": ({"set_values": {"tenant": "B"}}, "22023", '"tenant"'),
    "set_values_assigns_revision": ({"set_values": {"revision": 7}}, "22023", '"revision"'),
    "no_unique_index": ({"target": "nounique"}, "42P10", "does not name one row"),
    "null_items": ({"items": None}, "22004", '"items"'),
}


@pytest.mark.parametrize("case", list(BAD_REGISTRATIONS))
def test_bad_registration_is_refused_and_nothing_is_stored(db, case):
    changes, sqlstate, named = BAD_REGISTRATIONS[case]
    orders = Orders(db, "bad", a_ids=range(1, 10))
    request = {
        "target": orders.name,
        "items": [{"id": 3, "revision": 4, "qty": 4}, {"id": 5, "revision": 2, "qty": 6}],
        "chunk_size": 10,
        "set_values": CANCEL,
    }
    request.update(changes)
    if request["target"] == "nounique":
        request["target"] = Orders(db, "nounique", a_ids=range(1, 10), primary_key=False).name
    job = db.new_batch(case)
    with pytest.raises(psycopg.Error) as refused:
        register(db.connect(), job, **request)
    assert refused.value.sqlstate == sqlstate, (refused.value.sqlstate, str(refused.value))
    assert named in str(refused.value), str(refused.value)
    assert job_row(db, job) is None
    assert job_items(db, job) == []


def test_an_approval_of_nothing_is_a_job_done_at_once(db):
    """A night with nothing to do registers a job that is done: a NOTICE says so, the
    drain finds nothing to do, and the same approval again changes nothing."""
    orders = Orders(db, "nothing_orders", a_ids=range(1, 4))
    before = orders.snapshot()
    job = db.new_batch("nothing")
    conn = db.connect()
    notices = []
    registered = register(conn, job, orders.name, [], notices=notices)
    assert (registered["created"], registered["items"], registered["chunks"]) == (True, 0, 0)
    assert notices == [f'job "{job}" approved no items: it is done']
    row = job_row(db, job)
    assert (row["status"], row["item_count"], row["next_index"], row["chunks_committed"]) == (
        "done", 0, 0, 0)
    result = drain(conn, job)
    assert (result["committed_chunks"], result["status"]) == (0, "done")
    again = register(conn, job, orders.name, [])
    assert again["created"] is False
    with pytest.raises(errors.DuplicateObject):
        register(conn, job, orders.name, [{"id": 1, "revision": 1}])
    assert orders.snapshot() == before


def test_unknown_target_fails_at_the_regclass_cast(db):
    job = db.new_batch("notable")
    with pytest.raises(errors.UndefinedTable) as refused:
        register(db.connect(), job, "no_such_table", [{"id": 1, "revision": 1}])
    assert refused.value.sqlstate == "42P01"
    assert "no_such_table" in str(refused.value)
    assert job_row(db, job) is None


# 7. handler jobs --------------------------------------------------------------------------


def make_handler(db, orders, prelude="", conn=None, fn=None):
    """A handler that cancels the item's order, created on conn (its role owns it) or as
    the superuser; `prelude` is plpgsql run before the change; `fn` its name (a new one
    by default)."""
    fn = fn or f"cancel_order_{secrets.token_hex(3)}"
    (conn or db.admin).execute(
        sql.SQL(
            """CREATE FUNCTION {fn}(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
               DECLARE r jsonb;
               BEGIN
                 """ + prelude + """
                 UPDATE {t} SET status = 'cancelled', revision = revision + 1
                  WHERE tenant = item->>'tenant' AND id = (item->>'id')::int
                    AND revision = (item->>'revision')::int
                 RETURNING to_jsonb({t}.*) INTO r;
                 RETURN r;
               END $$"""
        ).format(fn=sql.Identifier(fn), t=orders.ident)
    )
    return f"{fn}(jsonb)"


def test_handler_job_drains_to_done(db):
    orders = Orders(db, "handler", a_ids=range(1, 60), b_ids=range(1, 60))
    handler = make_handler(db, orders)
    keys = pick_keys(7, 25, range(1, 60))
    job = db.new_batch("handler")
    registered = register(db.connect(), job, orders.name, shuffled(orders.items(keys), 8),
                          set_values=None, expect=None, handler=handler)
    assert registered == {"job_id": job, "created": True, "items": 25, "chunks": 3}
    result = drain(db.connect(), job)
    assert result == committed(keys, 3, "done")
    assert_job_complete(db, orders, job, keys)
    # tenant B's rows with the same ids: untouched
    assert_others_untouched(orders, keys)


def test_a_dropped_handler_stops_the_job_instead_of_changing_rows_without_it(db):
    orders = Orders(db, "hdropped", a_ids=range(1, 30))
    handler = make_handler(db, orders)
    keys = pick_keys(9, 12, range(1, 30))
    job = db.new_batch("hdropped")
    register(db.connect(), job, orders.name, orders.items(keys),
             set_values=None, expect=None, handler=handler)
    assert drain(db.connect(), job, 1)["committed_chunks"] == 1
    db.admin.execute(f"DROP FUNCTION {handler}")

    with pytest.raises(errors.UndefinedFunction) as missing:
        drain(db.connect(), job)
    assert missing.value.sqlstate == "42883"
    assert f'the handler of job "{job}" no longer exists' in str(missing.value)
    assert_changed_once(orders, keys[:10])
    assert_untouched(orders, keys[10:])
    assert job_row(db, job)["next_index"] == 10
    # the job keeps its handler by name (what pg_upgrade keeps): created again under
    # that name, it is the job's handler again, and the job finishes
    name = handler.split("(")[0]
    assert db.admin.execute("SELECT handler FROM etc_batch.job WHERE job_id = %s",
                            (job,)).fetchone()["handler"] == f"public.{name}(pg_catalog.jsonb)"
    make_handler(db, orders, fn=name)
    assert drain(db.connect(), job)["status"] == "done"
    assert_changed_once(orders, keys)


def test_handler_conflict_rolls_back_the_chunk(db):
    orders = Orders(db, "hconflict", a_ids=range(1, 60))
    handler = make_handler(db, orders)
    keys = pick_keys(8, 25, range(1, 60))
    job = db.new_batch("hconflict")
    register(db.connect(), job, orders.name, orders.items(keys),
             set_values=None, expect=None, handler=handler)
    assert drain(db.connect(), job, 1) == committed(keys[:10], 1, "pending")

    contested = keys[16]  # the 7th of chunk 2: the handler has changed six rows before it
    orders.execute("UPDATE {t} SET revision = revision + 1 WHERE tenant = 'A' AND id = %s",
                   (contested,))
    with pytest.raises(errors.IntegrityConstraintViolation) as conflict:
        drain(db.connect(), job)
    assert conflict.value.sqlstate == "23000"

    assert_changed_once(orders, keys[:10])
    assert_untouched(orders, keys[10:16] + keys[17:])
    revision, qty, _ = orders.initial[("A", contested)]
    assert orders.snapshot()[("A", contested)] == (revision + 1, qty, "pending")
    assert audit_count_by_key(db, job) == Counter(keys_text(keys[:10]))
    j = job_row(db, job)
    assert (j["status"], j["next_index"]) == ("conflict", 10)
    assert j["problem"]["key"] == str(contested)


@pytest.mark.parametrize("kind", ["set_values", "handler"])
def test_an_item_removed_from_the_list_unseen_makes_the_job_corrupt(db, kind):
    """An approved item cut out of its chunk's row with the counting trigger bypassed (a
    superuser under session_replication_role = replica) leaves the seal and the counters
    as they were; the chunk that should hold it changes one row fewer than it has
    positions, is rolled back whole, and the job is corrupt (XX001), for a guarded update
    as for a handler."""
    orders = Orders(db, f"short_{kind}", a_ids=range(1, 40))
    keys = pick_keys(13, 25, range(1, 40))
    job = db.new_batch(f"short_{kind}")
    if kind == "handler":
        register(db.connect(), job, orders.name, orders.items(keys),
                 set_values=None, expect=None, handler=make_handler(db, orders))
    else:
        register(db.connect(), job, orders.name, orders.items(keys))
    assert drain(db.connect(), job, 1)["committed_chunks"] == 1
    number = job_row(db, job)["job_number"]
    with db.connect() as c:
        c.execute("SET session_replication_role = replica")
        # position 13, the fourth item of the chunk that begins at 10
        c.execute(f"UPDATE etc_batch.job_item_chunk_{number} "
                  "SET keys = keys[1:3] || keys[5:], revisions = revisions[1:3] || revisions[5:], "
                  "guards = guards[1:3] || guards[5:], last_position = last_position - 1 "
                  "WHERE first_position = 10")
    assert job_row(db, job)["item_changes"] == 0

    with pytest.raises(errors.DataCorrupted) as refused:
        drain(db.connect(), job)
    assert refused.value.sqlstate == "XX001"
    assert "Positions 10 to 19 should hold 10 approved items, but 9 were found." in str(refused.value)
    assert_changed_once(orders, keys[:10])
    assert_untouched(orders, keys[10:])
    j = job_row(db, job)
    assert (j["status"], j["next_index"]) == ("corrupt", 10)


# 8. max_chunks, done jobs, aborted jobs ---------------------------------------------------


def test_max_chunks_and_a_done_job(db):
    keys = pick_keys(11, 45, range(1, 90))
    orders = Orders(db, "maxchunks", a_ids=range(1, 90))
    job = db.new_batch("maxchunks")
    register(db.connect(), job, orders.name, orders.items(keys))
    conn = db.connect()

    assert drain(conn, job, 2) == committed(keys[:20], 2, "pending")
    assert audit_count_by_key(db, job) == Counter(keys_text(keys[:20]))
    assert job_row(db, job)["next_index"] == 20
    assert_untouched(orders, keys[20:])

    assert drain(conn, job, 0) == committed([], 0, "pending")
    assert job_row(db, job)["next_index"] == 20

    with pytest.raises(errors.InvalidParameterValue):
        drain(conn, job, -1)

    assert drain(conn, job) == committed(keys[20:], 3, "done")
    assert_job_complete(db, orders, job, keys)

    # a done job: nothing to do, no error, zero counts rather than NULL
    for max_chunks in (None, 1):
        notices = []
        assert drain(conn, job, max_chunks, notices=notices) == committed([], 0, "done")
        assert not [n for n in notices if n.startswith("chunk ")]
    assert_job_complete(db, orders, job, keys)


def test_aborted_job_is_not_drained(db):
    keys = pick_keys(12, 15, range(1, 30))
    orders = Orders(db, "abort", a_ids=range(1, 30))
    job = db.new_batch("abort")
    register(db.connect(), job, orders.name, orders.items(keys))
    drain(db.connect(), job, 1)
    db.admin.execute("SELECT etc_batch.abort_job(%s, %s)", (job, "customer withdrew"))
    with pytest.raises(errors.ObjectNotInPrerequisiteState) as refused:
        drain(db.connect(), job)
    assert refused.value.sqlstate == "55000"
    assert_changed_once(orders, keys[:10])
    assert_untouched(orders, keys[10:])
    j = job_row(db, job)
    assert (j["status"], j["next_index"], j["status_reason"]) == (
        "aborted", 10, "customer withdrew")


def test_unknown_job_and_transaction_block_are_refused(db):
    with pytest.raises(errors.UndefinedObject):
        drain(db.connect(), "no such job")

    keys = pick_keys(13, 12, range(1, 20))
    orders = Orders(db, "atomic", a_ids=range(1, 20))
    job = db.new_batch("atomic")
    register(db.connect(), job, orders.name, orders.items(keys))
    conn = db.connect(autocommit=False)
    with pytest.raises(psycopg.Error) as refused:
        drain(conn, job)
    assert refused.value.sqlstate == "2D000", str(refused.value)
    conn.rollback()
    assert_untouched(orders, keys)
    assert job_row(db, job)["next_index"] == 0


# 9. privileges ----------------------------------------------------------------------------


REGISTER_SIGNATURE = (
    "etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, "
    "name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[])"
)
DRAIN_SIGNATURE = ("etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, "
                   "text, text)")


def grant_job_api(db, role):
    r = sql.Identifier(role)
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(r))
    db.admin.execute(
        sql.SQL("GRANT EXECUTE ON FUNCTION " + REGISTER_SIGNATURE + " TO {}").format(r))
    db.admin.execute(sql.SQL("GRANT EXECUTE ON PROCEDURE " + DRAIN_SIGNATURE + " TO {}").format(r))


def as_role(db, role):
    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    return conn


def test_job_changes_rows_as_the_registering_role(db, roles):
    clerk = roles("clerk")
    intruder = roles("intruder")
    orders = Orders(db, "priv", a_ids=range(1, 40), b_ids=range(1, 40))
    changes = f"changes_{secrets.token_hex(3)}"
    db.admin.execute(
        sql.SQL("CREATE TABLE {} (id integer, changed_by name DEFAULT current_user)")
        .format(sql.Identifier(changes)))
    db.admin.execute(
        sql.SQL(
            """CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN INSERT INTO {c} (id) VALUES (NEW.id); RETURN NEW; END $$"""
        ).format(fn=sql.Identifier(f"{changes}_fn"), c=sql.Identifier(changes)))
    db.admin.execute(
        sql.SQL("CREATE TRIGGER record_change AFTER UPDATE ON {t} FOR EACH ROW "
                "EXECUTE FUNCTION {fn}()").format(t=orders.ident,
                                                  fn=sql.Identifier(f"{changes}_fn")))
    for role in (clerk, intruder):
        grant_job_api(db, role)
        db.admin.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(orders.ident,
                                                                     sql.Identifier(role)))
    db.admin.execute(sql.SQL("GRANT UPDATE ON {} TO {}").format(orders.ident,
                                                                 sql.Identifier(clerk)))
    db.admin.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(sql.Identifier(changes),
                                                                 sql.Identifier(clerk)))

    keys = pick_keys(14, 25, range(1, 40))
    items = orders.items(keys)

    # without UPDATE on the table, no job on it
    bad_job = db.new_batch("intruder")
    with pytest.raises(errors.InsufficientPrivilege) as refused:
        register(as_role(db, intruder), bad_job, orders.name, items)
    assert refused.value.sqlstate == "42501"
    assert job_row(db, bad_job) is None and job_items(db, bad_job) == []

    job = db.new_batch("clerk")
    clerk_conn = as_role(db, clerk)
    assert register(clerk_conn, job, orders.name, items)["created"] is True
    assert job_row(db, job)["registered_by"] == clerk
    # the clerk drains a chunk, the superuser drains the rest: both change rows as clerk
    assert drain(clerk_conn, job, 1) == committed(keys[:10], 1, "pending")
    assert drain(db.connect(), job)["status"] == "done"
    assert_job_complete(db, orders, job, keys)
    recorded = db.admin.execute(
        sql.SQL("SELECT id, changed_by::text AS changed_by FROM {} ORDER BY id")
        .format(sql.Identifier(changes))).fetchall()
    assert [r["id"] for r in recorded] == keys
    assert {r["changed_by"] for r in recorded} == {clerk}


def test_row_level_security_of_the_registering_role_applies(db, roles):
    clerk = roles("clerk")
    orders = Orders(db, "rls", a_ids=range(1, 30), b_ids=range(1, 30))
    grant_job_api(db, clerk)
    db.admin.execute(sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(orders.ident,
                                                                         sql.Identifier(clerk)))
    orders.execute("ALTER TABLE {t} ENABLE ROW LEVEL SECURITY")
    db.admin.execute(
        sql.SQL("CREATE POLICY tenant_a ON {} TO {} USING (tenant = 'A')")
        .format(orders.ident, sql.Identifier(clerk)))

    keys = pick_keys(15, 12, range(1, 30))
    clerk_conn = as_role(db, clerk)
    job_a = db.new_batch("rls_a")
    register(clerk_conn, job_a, orders.name, orders.items(keys))
    job_b = db.new_batch("rls_b")
    register(clerk_conn, job_b, orders.name, orders.items(keys, tenant="B"), tenant="B")

    # drained by the superuser, who bypasses row-level security: the change still runs
    # as the clerk, who cannot see tenant B's rows
    with pytest.raises(errors.IntegrityConstraintViolation):
        drain(db.connect(), job_b)
    assert orders.snapshot() == orders.initial
    assert job_row(db, job_b)["status"] == "conflict"

    assert drain(db.connect(), job_a)["status"] == "done"
    assert_job_complete(db, orders, job_a, keys)


# etc_batch's own writes -------------------------------------------------------------------


def test_a_trigger_on_the_audit_sees_every_audit_row(db):
    """A chunk's audit row is written without a statement, except where the job's
    audit partition has a trigger for INSERT: then by a statement, so that a trigger a
    DBA put on etc_batch.job_audit_chunk (and PostgreSQL cloned onto every partition)
    sees every chunk's row, once."""
    keys = pick_keys(71, 25, range(1, 60))
    orders = Orders(db, "audit_trigger", a_ids=range(1, 60), b_ids=range(1, 10))
    job = db.new_batch("audit_trigger")
    seen = sql.Identifier(f"{job}_seen")
    fn = sql.Identifier(f"{job}_note")
    db.admin.execute(sql.SQL("CREATE TABLE {} (job_id text, first int, last int)").format(seen))
    db.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO {seen} VALUES (NEW.job_id, NEW.first_position, NEW.last_position); "
        "RETURN NULL; END $$"
    ).format(fn=fn, seen=seen))
    register(db.connect(), job, orders.name, shuffled(orders.items(keys), 3), chunk_size=10)
    db.admin.execute(sql.SQL(
        "CREATE TRIGGER seen AFTER INSERT ON etc_batch.job_audit_chunk FOR EACH ROW "
        "EXECUTE FUNCTION {}()"
    ).format(fn))
    try:
        assert drain(db.connect(), job)["status"] == "done"
    finally:
        db.admin.execute("DROP TRIGGER IF EXISTS seen ON etc_batch.job_audit_chunk")
    chunks = db.admin.execute(
        sql.SQL("SELECT first, last FROM {} WHERE job_id = %s ORDER BY first").format(seen), (job,)
    ).fetchall()
    assert [(r["first"], r["last"]) for r in chunks] == [(0, 9), (10, 19), (20, 24)]
    assert_job_complete(db, orders, job, keys)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_trigger_on_the_job_and_its_chunks_sees_every_mark(db, parallel):
    """The job's row (a sequential job's checkpoint) and a parallel job's chunk rows are
    changed without a statement, except where the table has a trigger for UPDATE: then
    the same change, built from the same list of columns, by a statement, so that a
    trigger a DBA put there sees every checkpoint and every chunk marked committed, once,
    and the job still drains exactly once."""
    keys = pick_keys(73, 30, range(1, 60))
    orders = Orders(db, f"mark_trigger_{int(parallel)}", a_ids=range(1, 60))
    job = db.new_batch(f"mark_trigger_{int(parallel)}")
    seen = sql.Identifier(f"{job}_seen")
    fn = sql.Identifier(f"{job}_note")
    db.admin.execute(sql.SQL("CREATE TABLE {} (tbl text, row jsonb)").format(seen))
    db.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO {seen} VALUES (TG_TABLE_NAME, to_jsonb(NEW)); RETURN NULL; END $$"
    ).format(fn=fn, seen=seen))
    register(db.connect(), job, orders.name, orders.items(keys), parallel=parallel)
    number = job_row(db, job)["job_number"]
    table = f"job_chunk_{number}" if parallel else "job"
    db.admin.execute(sql.SQL(
        "CREATE TRIGGER seen AFTER UPDATE ON etc_batch.{} FOR EACH ROW EXECUTE FUNCTION {}()"
    ).format(sql.Identifier(table), fn))
    try:
        assert drain(db.connect(), job)["status"] == "done"
    finally:
        db.admin.execute(sql.SQL("DROP TRIGGER IF EXISTS seen ON etc_batch.{}").format(
            sql.Identifier(table)))
    rows = [r["row"] for r in db.admin.execute(
        sql.SQL("SELECT row FROM {} WHERE tbl = %s").format(seen), (table,)).fetchall()]
    if parallel:
        assert sorted(r["chunk"] for r in rows) == [1, 2, 3]
        assert all(r["committed"] and r["txid"] is not None for r in rows)
    else:
        assert [r["next_index"] for r in rows] == [10, 20, 30]
        assert [r["chunks_committed"] for r in rows] == [1, 2, 3]
        assert rows[-1]["status"] == "done"
    assert_job_complete(db, orders, job, keys)
    checks = db.admin.execute("SELECT ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert all(c["ok"] for c in checks)


def test_a_column_added_to_the_audit_stops_the_drain_cleanly(db):
    """etc_batch writes the audit partition's columns itself: a column added by hand is
    refused (55000), with the chunk rolled back and the job still pending, never an
    audit row written without it; once the column is dropped again the job drains."""
    keys = pick_keys(72, 12, range(1, 30))
    orders = Orders(db, "audit_column", a_ids=range(1, 30))
    job = db.new_batch("audit_column")
    register(db.connect(), job, orders.name, orders.items(keys), chunk_size=5)
    partition = db.admin.execute(
        "SELECT 'job_audit_chunk_' || job_number AS p FROM etc_batch.job WHERE job_id = %s", (job,)
    ).fetchone()["p"]
    db.admin.execute("ALTER TABLE etc_batch.job_audit_chunk ADD COLUMN note text")
    try:
        with pytest.raises(errors.ObjectNotInPrerequisiteState) as refused:
            drain(db.connect(), job)
        assert refused.value.diag.message_primary == (
            f"table etc_batch.{partition} does not have the columns etc_batch writes")
        assert refused.value.diag.message_detail.startswith('Column "note" was added')
        assert orders.snapshot() == orders.initial
        assert (job_row(db, job)["status"], job_row(db, job)["next_index"]) == ("pending", 0)
        assert audit_rows(db, job) == []
    finally:
        db.admin.execute("ALTER TABLE etc_batch.job_audit_chunk DROP COLUMN IF EXISTS note")
    # a dropped column stays in the row type, invisible: the writer leaves it NULL
    assert drain(db.connect(), job)["status"] == "done"
    assert_job_complete(db, orders, job, keys)


# 10. parallel jobs: many drainers, one job ------------------------------------------------


def chunk_rows(db, job):
    return db.admin.execute(
        "SELECT chunk, committed, txid FROM etc_batch.job_chunk WHERE job_id = %s ORDER BY chunk",
        (job,),
    ).fetchall()


def assert_parallel_job_complete(db, orders, job, keys, chunk_size=10):
    """A parallel job done exactly once: every approved key changed once and audited
    once, each chunk's audit rows written by the one transaction its row names as the
    one that committed it, and verify_job finds nothing."""
    assert_job_complete(db, orders, job, keys)
    by_chunk = audit_by_chunk(db, job)
    rows = chunk_rows(db, job)
    assert len(rows) == (len(keys) + chunk_size - 1) // chunk_size
    for r in rows:
        assert r["committed"], r
        assert by_chunk[r["chunk"]][0] == r["txid"], (r, by_chunk[r["chunk"]])
    checks = db.admin.execute("SELECT * FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert all(c["ok"] for c in checks), checks


def slow_chunks(db, orders, label, seconds):
    """Every chunk's UPDATE takes at least `seconds`: drainers overlap, and a backend
    killed at a random moment is most likely inside a chunk."""
    fn = sql.Identifier(f"{label}_slow")
    db.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep({s}); RETURN NULL; END $$"
    ).format(fn=fn, s=sql.Literal(seconds)))
    orders.execute(sql.SQL(
        "CREATE TRIGGER slow AFTER UPDATE ON {{t}} FOR EACH STATEMENT EXECUTE FUNCTION {fn}()"
    ).format(fn=fn).as_string(db.admin))


@pytest.mark.parametrize("transaction_time", [None, "150ms"], ids=["chunk_per_transaction", "by_time"])
def test_eight_drainers_killed_at_random_drain_a_parallel_job_exactly_once(db, transaction_time):
    """8 drainers over one parallel job of 3,000 items in chunks of 10, a random one
    terminated (pg_terminate_backend) every few tens of milliseconds and started again,
    until the job is done: each chunk committed once, by one transaction, every item
    changed and audited exactly once, verify_job clean; no drainer ever waited for a
    chunk another held. With a transaction_time, each drainer commits the chunks it
    claims several at a time, and a kill takes all of them back."""
    universe = range(1, 3601)
    keys = pick_keys(21, 3000, universe)
    orders = Orders(db, "par8", a_ids=universe, b_ids=range(1, 300))
    job = db.new_batch("par8")
    registered = register(db.connect(), job, orders.name, shuffled(orders.items(keys), 3),
                          parallel=True)
    assert registered["chunks"] == 300
    if transaction_time is not None:
        db.admin.execute("SELECT etc_batch.pace_job(%s, transaction_time => %s::interval)",
                         (job, transaction_time))
    slow_chunks(db, orders, f"par8_{transaction_time is None}", 0.01)

    done = threading.Event()
    failures = []
    results = []

    def worker():
        while not done.is_set():
            try:
                conn = db.connect()
                r = drain(conn, job)
                conn.close()
            except psycopg.OperationalError:
                continue  # terminated: start again, as a scheduler would
            except BaseException as exc:  # kept for the assertion below
                failures.append(exc)
                return
            results.append(r)
            if r["status"] == "done":
                done.set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    rng = random.Random(5)
    killed = 0
    while not done.is_set() and killed < 40:
        done.wait(rng.uniform(0.02, 0.06))
        pids = [r["pid"] for r in db.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
            ("%CALL etc_batch.drain_job%",)).fetchall()]
        if pids and not done.is_set():
            pid = rng.choice(pids)
            if db.admin.execute("SELECT pg_terminate_backend(%s) AS t", (pid,)).fetchone()["t"]:
                killed += 1
    # the survivors finish what is left
    for t in threads:
        t.join(JOIN)
        assert not t.is_alive()
    assert failures == []
    assert killed > 0
    assert done.is_set()
    print(f"{killed} drainers killed, {len(results)} calls returned, "
          f"{sum(1 for r in results if r['committed_chunks'] > 0)} of them with chunks")
    assert_parallel_job_complete(db, orders, job, keys)
    # several drainers committed chunks, and the calls' counts add up to at most the
    # chunks (a killed call's chunks are counted by no result)
    assert sum(r["committed_chunks"] for r in results) <= 300
    shared = Counter(txid for txid, _ in audit_by_chunk(db, job).values())
    if transaction_time is None:
        assert max(shared.values()) == 1
    else:
        assert max(shared.values()) > 1, shared


def test_parallel_drainers_share_the_chunks_without_waiting(db):
    """Drainers released together over a parallel job each commit chunks of their own,
    at the same time: the chunks' commit times interleave, and the calls' counts add up
    to every chunk."""
    universe = range(1, 401)
    keys = pick_keys(4, 400, universe)
    orders = Orders(db, "par4", a_ids=universe)
    job = db.new_batch("par4")
    register(db.connect(), job, orders.name, orders.items(keys), parallel=True)
    slow_chunks(db, orders, "par4", 0.02)
    barrier = threading.Barrier(4 + 1)
    drainers = [Drainer(db, job, barrier) for _ in range(4)]
    for d in drainers:
        d.start()
    barrier.wait(WAIT)
    for d in drainers:
        d.join()
        assert d.error is None, d.error
    # 40 chunks of at least 20 ms each, by 4 drainers: far less than 40 x 20 ms apart
    assert sum(d.result["committed_chunks"] for d in drainers) == 40
    assert sum(1 for d in drainers if d.result["committed_chunks"] > 0) >= 2
    assert {d.result["status"] for d in drainers} <= {"done", "pending"}
    assert "done" in {d.result["status"] for d in drainers}
    stamps = sorted(s for _, s in audit_by_chunk(db, job).values())
    assert (stamps[-1] - stamps[0]).total_seconds() < 40 * 0.02
    assert_parallel_job_complete(db, orders, job, keys)


def tamper_parallel_audit_inside_open_chunk(db, job, number):
    db.admin.execute(
        f"INSERT INTO etc_batch.job_audit_chunk_{number} "
        "(job_id, first_position, last_position, chunk, txid, committed_at, revisions_after) "
        "VALUES (%s, 25, 25, 3, 1, now(), '{9}')", (job,))


def tamper_parallel_chunk_reopened(db, job, number):
    db.admin.execute(f"UPDATE etc_batch.job_chunk_{number} SET committed = false WHERE chunk = 1")


def tamper_parallel_audit_deleted(db, job, number):
    # the row of the chunk that holds position 3
    db.admin.execute(f"DELETE FROM etc_batch.job_audit_chunk_{number} WHERE first_position = 0")


PARALLEL_TAMPERING = {
    "audit_row_in_open_chunk": tamper_parallel_audit_inside_open_chunk,
    "chunk_reopened": tamper_parallel_chunk_reopened,
    "audit_row_deleted": tamper_parallel_audit_deleted,
}


@pytest.mark.parametrize("case", list(PARALLEL_TAMPERING))
def test_tampered_parallel_progress_is_refused_and_nothing_changes(db, case):
    keys = pick_keys(len(case) + 40, 35, range(1, 70))
    orders = Orders(db, "ptamper", a_ids=range(1, 70))
    job = db.new_batch(f"ptamper_{case}")
    register(db.connect(), job, orders.name, orders.items(keys), parallel=True)
    assert drain(db.connect(), job, 2)["committed_chunks"] == 2
    number = job_row(db, job)["job_number"]
    PARALLEL_TAMPERING[case](db, job, number)
    business = orders.snapshot()

    with pytest.raises(errors.DataCorrupted) as refused:
        drain(db.connect(), job)
    assert refused.value.sqlstate == "XX001"
    assert orders.snapshot() == business
    j = job_row(db, job)
    assert j["status"] == "corrupt" and j["status_reason"], j
    checks = db.admin.execute("SELECT * FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert any(not c["ok"] for c in checks), checks


def test_a_parallel_handler_job_drains_to_done(db):
    orders = Orders(db, "phandler", a_ids=range(1, 60), b_ids=range(1, 60))
    handler = make_handler(db, orders)
    keys = pick_keys(17, 25, range(1, 60))
    job = db.new_batch("phandler")
    register(db.connect(), job, orders.name, orders.items(keys),
             set_values=None, expect=None, handler=handler, parallel=True)
    barrier = threading.Barrier(3)
    drainers = [Drainer(db, job, barrier) for _ in range(2)]
    for d in drainers:
        d.start()
    barrier.wait(WAIT)
    for d in drainers:
        d.join()
        assert d.error is None, d.error
    assert sum(d.result["committed_chunks"] for d in drainers) == 3
    assert_parallel_job_complete(db, orders, job, keys)
    assert_others_untouched(orders, keys)


def change_plans(conn, job):
    """The plans of the UPDATEs a drain of `job` ran, as auto_explain tells them."""
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_level = notice",
    ):
        conn.execute(setting)
    conn.execute("CALL etc_batch.drain_job(%s)", (job,))
    return [n for n in notices if "Update on" in n]


def test_a_large_chunk_reads_its_dense_range_once_and_probes_scattered_items(db):
    """A chunk of 200 items or more is planned for its own items and key range: where
    its items are the rows of its range, the range is read once and joined; where they
    are scattered among other rows, the key's index is probed once per item. A smaller
    chunk shares a plan made once: of the key's range, joined, when its items are at
    least four fifths of the keys in it (a key of one integer column); else one that
    probes."""
    admin = db.admin
    admin.execute(
        "CREATE TABLE plan_rows (id int PRIMARY KEY, revision int NOT NULL DEFAULT 1, "
        "status text NOT NULL DEFAULT 'new')"
    )
    admin.execute("INSERT INTO plan_rows (id) SELECT g FROM generate_series(1, 300000) g")
    admin.execute("ANALYZE plan_rows")
    jobs = {
        # name: (the items, chunk size)
        "dense": ("id <= 2000", 500),
        "scattered": ("id > 3000 AND id % 200 = 0", 500),
        "small": ("id > 2000 AND id <= 2400", 100),
        "small scattered": ("id > 2400 AND id % 200 = 100", 100),
    }
    plans = {}
    for name, (where, chunk) in jobs.items():
        job = db.new_batch(f"plans-{name}")
        admin.execute(
            "SELECT etc_batch.register_job_from_query(%s, NULL, 'plan_rows', "
            "format('SELECT id, revision FROM plan_rows WHERE %%s', %s::text), %s, "
            "'{\"status\": \"done\"}')",
            (job, where, chunk),
        )
        with db.connect() as conn:
            plans[name] = change_plans(conn, job)
        count = admin.execute(
            f"SELECT count(*) FROM plan_rows WHERE status = 'done' AND revision = 2 AND {where}"
        ).fetchone()["count"]
        total = admin.execute(f"SELECT count(*) FROM plan_rows WHERE {where}").fetchone()["count"]
        assert count == total, (name, count, total)
    assert len(plans["dense"]) == 4 and len(plans["scattered"]) == 3 and len(plans["small"]) == 4
    assert len(plans["small scattered"]) == 15
    assert all("Nested Loop" not in p and "Join" in p for p in plans["dense"]), plans["dense"]
    assert all("Nested Loop" in p for p in plans["scattered"]), plans["scattered"]
    assert all("Nested Loop" not in p and "Join" in p for p in plans["small"]), plans["small"]
    assert all("Nested Loop" in p for p in plans["small scattered"]), plans["small scattered"]
