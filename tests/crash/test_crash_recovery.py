"""The whole server killed (`pg_ctl stop -m immediate`) in the middle of a drain and of
a chain, at random moments, then started again, which runs crash recovery.

After each restart, before anything resumes, the database must hold exactly what was
committed. For a job: the business change, the audit rows and the checkpoint of every
committed chunk, each change made once and in the same transaction as its audit row,
and nothing of any other chunk. For a chain: the writes, the done mark and the audit row
of every step marked done, in one transaction, and nothing of any other step. Whatever
the client was told had committed (the NOTICE is sent only after the COMMIT, and
synchronous_commit is on) must be among it. Then the same CALL resumes, finishes, and
every item or step has been applied exactly once; one more CALL changes nothing.

A round whose CALL finished before the crash still has its invariants checked, but it
proves less, so the sizes follow the speed the machine shows and the test requires that
at least half of the rounds crashed with work left.
"""

import math
import random
import re
import threading
import time
from collections import Counter

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from conftest import SEED, wait_until
from support import size_from_env

# at least four rounds each: half of them must crash with work left, two at the least
DRAIN_ROUNDS = size_from_env("ETC_BATCH_CRASH_DRAIN_ROUNDS", 15, least=4)
PARALLEL_ROUNDS = size_from_env("ETC_BATCH_CRASH_PARALLEL_ROUNDS", 8, least=4)
CHAIN_ROUNDS = size_from_env("ETC_BATCH_CRASH_CHAIN_ROUNDS", 12, least=4)
# How long a whole drain, or a chain of trivial steps, of one round should take: long
# enough for a random moment to land inside it most of the time, short enough to keep
# the module within minutes.
DRAIN_SECONDS = 2.0
QUICK_SECONDS = 1.0
# Upper bound for a CALL to come back once its server is gone.
JOIN = 60.0

CANCEL = {"status": "cancelled"}
PENDING = {"status": "pending"}
CHUNK_NOTICE = re.compile(r"^chunk (\d+) of (\d+) committed: ")
STEP_NOTICE = re.compile(r'^step (\d+) of batch "([^"]+)" committed$')

# Records, in the row itself, the transaction that changed it, so a row can be matched
# to the audit row that must have been committed with it.
NOTE_CHANGE = """
CREATE FUNCTION note_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_in := txid_current();
    RETURN NEW;
END
$$"""


# calls in flight ---------------------------------------------------------------------------


class Call:
    """A CALL in a thread of its own, on a connection of its own; keeps the notices the
    backend sent before it died, and its result row or its error."""

    def __init__(self, cluster, statement, params=(), dbname=None):
        self.conn = cluster.connect(dbname or cluster.test_db)
        self.pid = self.conn.info.backend_pid
        self.notices = []
        self.conn.add_notice_handler(self._notice)
        self.result = None
        self.error = None
        self.sent_at = None
        self.returned_at = None
        self.finished = threading.Event()
        self._statement = statement
        self._params = params
        self._thread = threading.Thread(target=self._run, name=f"call-{self.pid}", daemon=True)

    def _notice(self, diag):
        self.notices.append(diag.message_primary or "")

    def _run(self):
        try:
            self.sent_at = time.monotonic()
            cur = self.conn.execute(self._statement, self._params)
            self.result = cur.fetchone() if cur.description else ()
            self.returned_at = time.monotonic()
        except BaseException as exc:  # kept for the test to assert on
            self.error = exc
        finally:
            self.finished.set()

    def start(self):
        self._thread.start()
        return self

    def join(self):
        self._thread.join(JOIN)
        assert not self._thread.is_alive(), f"the CALL in backend {self.pid} did not return"
        try:
            self.conn.close()
        except Exception:
            pass
        return self

    def killed(self):
        """Whether the crash ended the CALL; any error but losing the server fails."""
        if self.error is None:
            return False
        assert isinstance(self.error, psycopg.OperationalError), (
            f"the CALL failed for a reason other than the crash: {self.error!r}"
        )
        return True


def wait_active(admin, call):
    """Waits until call's statement runs on the server (or has already returned), so
    the random delay is measured from the start of the work."""

    def running():
        if call.finished.is_set():
            return True
        row = admin.execute(
            "SELECT state FROM pg_stat_activity WHERE pid = %s", (call.pid,)
        ).fetchone()
        return row is not None and row[0] == "active"

    wait_until(running, f"backend {call.pid} to start its CALL", interval=0.002)


def crash_after(cluster, admin, call, delay):
    """Sleeps delay seconds into the call, then crashes the server and starts it again.
    Returns the seconds from the CALL's start to the crash, whether the call's backend
    had a transaction with writes open just before, and what it was waiting for then."""
    wait_active(admin, call)
    started = time.monotonic()
    time.sleep(delay)
    row = admin.execute(
        "SELECT backend_xid IS NOT NULL, wait_event FROM pg_stat_activity WHERE pid = %s",
        (call.pid,),
    ).fetchone()
    in_flight, wait_event = (bool(row[0]), row[1]) if row else (False, None)
    crashed_at = time.monotonic()
    admin.close()
    cluster.crash_and_restart()
    call.join()
    return crashed_at - (call.sent_at or started), in_flight, wait_event


# jobs --------------------------------------------------------------------------------------


def create_orders(conn, table, a_count, b_count):
    """orders(tenant, id, revision, qty, status, changed_in): tenant A with ids 1..a_count
    at revisions 1 to 4, tenant B with ids 1..b_count (the same ids) at revision 1, all
    pending; qty is 1 + id % 9 in both."""
    t = sql.Identifier(table)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {t} (tenant text NOT NULL, id integer NOT NULL, revision integer NOT NULL,"
            " qty integer NOT NULL, status text NOT NULL, changed_in bigint,"
            " PRIMARY KEY (tenant, id))"
        ).format(t=t)
    )
    conn.execute(
        sql.SQL(
            "CREATE TRIGGER note_change BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION note_change()"
        ).format(t=t)
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {t} (tenant, id, revision, qty, status)"
            " SELECT 'A', g, 1 + g %% 4, 1 + g %% 9, 'pending' FROM generate_series(1, %s) g"
            " UNION ALL"
            " SELECT 'B', g, 1, 1 + g %% 9, 'pending' FROM generate_series(1, %s) g"
        ).format(t=t),
        (a_count, b_count),
    )


def register(conn, job, table, ids, chunk_size, from_query=False, parallel=False):
    """Registers the approval an operator would take now for tenant A's ids: key,
    revision, and qty as a guard; cancel what is still pending. As a jsonb list, or
    with from_query as the rows of a SELECT (register_job_from_query)."""
    if from_query:
        query = sql.SQL(
            "SELECT id, revision, qty FROM {t} WHERE tenant = 'A' AND id = ANY({ids}::integer[])"
        ).format(t=sql.Identifier(table), ids=sql.Literal(ids)).as_string(conn)
        row = conn.execute(
            "SELECT job_id, created, items, chunks FROM etc_batch.register_job_from_query("
            "job_id => %s, tenant => 'A', target => %s::regclass, items_query => %s, "
            "chunk_size => %s, set_values => %s, expect => %s, parallel => %s)",
            (job, table, query, chunk_size, Jsonb(CANCEL), Jsonb(PENDING), parallel),
        ).fetchone()
    else:
        row = conn.execute(
            sql.SQL(
                """SELECT r.job_id, r.created, r.items, r.chunks
                     FROM (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision,
                                                               'qty', qty)) AS items
                             FROM {t} WHERE tenant = 'A' AND id = ANY(%s::integer[])) s,
                          etc_batch.register_job(job_id => %s, tenant => 'A',
                                                 target => %s::regclass, items => s.items,
                                                 chunk_size => %s, set_values => %s,
                                                 expect => %s, parallel => %s) r"""
            ).format(t=sql.Identifier(table)),
            (ids, job, table, chunk_size, Jsonb(CANCEL), Jsonb(PENDING), parallel),
        ).fetchone()
    assert row == (job, True, len(ids), math.ceil(len(ids) / chunk_size)), row


def drained(keys, chunks, status):
    """drain_job's result for a call that committed `keys` (as text), in `chunks` chunks."""
    return (chunks, len(keys), keys[0] if keys else None, keys[-1] if keys else None, status)


# Every approved item against its row and its audit row, in one snapshot: below the
# checkpoint, changed once (revision + 1, cancelled, qty kept) in the transaction of
# its audit row, whose revision after and chunk agree; at or beyond it, not audited and as
# it was created. The approved revision must be the one the row was created with.
ITEM_CHECK = """
SELECT i.position, i.item_key, i.revision AS approved_revision, o.revision, o.qty,
       o.status, o.changed_in, a.position AS audited, a.revision_after, a.chunk, a.txid
  FROM etc_batch.job j
  JOIN etc_batch.job_item i ON i.job_id = j.job_id
  LEFT JOIN {t} o ON o.tenant = 'A' AND o.id = i.item_key::integer
  LEFT JOIN etc_batch.job_audit a ON a.job_id = i.job_id AND a.position = i.position
 WHERE j.job_id = %(job)s
   AND (i.revision = 1 + i.item_key::integer %% 4
        AND o.qty = (i.guards ->> 'qty')::integer
        AND CASE WHEN i.position < j.next_index THEN
                 a.revision_after = i.revision + 1
             AND a.chunk = i.position / j.chunk_size + 1
             AND o.revision = i.revision + 1 AND o.status = 'cancelled'
             AND o.changed_in = a.txid
            ELSE
                 a.position IS NULL AND o.revision = i.revision AND o.status = 'pending'
             AND o.changed_in IS NULL
            END) IS NOT TRUE
 ORDER BY i.position
 LIMIT 5"""

# Every row that is not an approved row of tenant A, as it was created.
OTHERS_CHECK = """
SELECT o.tenant, o.id, o.revision, o.qty, o.status, o.changed_in
  FROM {t} o
 WHERE NOT (o.tenant = 'A'
            AND o.id::text IN (SELECT item_key FROM etc_batch.job_item WHERE job_id = %(job)s))
   AND (o.revision <> CASE o.tenant WHEN 'A' THEN 1 + o.id %% 4 ELSE 1 END
        OR o.qty <> 1 + o.id %% 9 OR o.status <> 'pending' OR o.changed_in IS NOT NULL)
 LIMIT 5"""


def check_job(conn, job, table, ids, counts, where):
    """Checks that the job's records and the business table hold every committed chunk
    whole and nothing else; returns (status, next_index, chunks_committed, chunk_size)."""
    t = sql.Identifier(table)
    status, n, chunks, count, size, audit_changes, item_changes, problem = conn.execute(
        """SELECT status, next_index, chunks_committed, item_count, chunk_size,
                  audit_changes, item_changes, problem
             FROM etc_batch.job WHERE job_id = %s""",
        (job,),
    ).fetchone()
    assert count == len(ids), where
    assert (audit_changes, item_changes) == (0, 0), where
    assert n == count or n % size == 0, f"{where}: checkpoint {n} is off a chunk boundary"
    assert chunks == math.ceil(n / size), f"{where}: {chunks} chunks for checkpoint {n}"
    assert status == ("done" if n == count else "pending"), f"{where}: {status} {problem}"
    frozen = conn.execute(
        "SELECT array_agg(item_key::integer ORDER BY position) FROM etc_batch.job_item"
        " WHERE job_id = %s",
        (job,),
    ).fetchone()[0]
    assert frozen == sorted(ids), f"{where}: the frozen list changed"

    rows, low, high, audited_chunks, txids, mixed = conn.execute(
        """SELECT count(*), min(position), max(position), count(DISTINCT chunk),
                  count(DISTINCT txid),
                  (SELECT count(*) FROM (SELECT FROM etc_batch.job_audit
                                          WHERE job_id = %(job)s
                                          GROUP BY chunk HAVING count(DISTINCT txid) <> 1) c)
             FROM etc_batch.job_audit WHERE job_id = %(job)s""",
        {"job": job},
    ).fetchone()
    assert rows == n, f"{where}: {rows} audit rows for checkpoint {n}"
    assert n == 0 or (low, high) == (0, n - 1), f"{where}: audit positions {low}..{high}"
    # one transaction per chunk, a different one for every chunk
    assert (audited_chunks, txids, mixed) == (chunks, chunks, 0), (
        f"{where}: {audited_chunks} audited chunks in {txids} transactions, {mixed} mixed,"
        f" for {chunks} committed chunks"
    )

    check_rows(conn, job, t, ITEM_CHECK, counts, f"{where} (checkpoint {n})")
    return status, n, chunks, size


def check_rows(conn, job, t, item_check, counts, where):
    """Every approved item applied once or not at all (item_check), no other row
    changed, none lost or added, and verify_job clean."""
    with conn.transaction():
        # Without statistics on fresh tables the planner picks nested loops, quadratic
        # over tens of thousands of items; a hash join is linear. Disabling a plan type
        # inflates the cost estimate, which would make JIT compile the query for longer
        # than it runs.
        conn.execute("SET LOCAL enable_nestloop = off")
        conn.execute("SET LOCAL jit = off")
        bad = conn.execute(sql.SQL(item_check).format(t=t), {"job": job}).fetchall()
    assert bad == [], f"{where}: items half-applied or applied twice: {bad}"
    others = conn.execute(sql.SQL(OTHERS_CHECK).format(t=t), {"job": job}).fetchall()
    assert others == [], f"{where}: rows outside the approval changed: {others}"
    per_tenant = dict(
        conn.execute(sql.SQL("SELECT tenant, count(*) FROM {t} GROUP BY tenant").format(t=t))
    )
    assert per_tenant == counts, f"{where}: rows lost or added: {per_tenant}"
    checks = conn.execute(
        "SELECT check_name, ok, detail FROM etc_batch.verify_job(%s)", (job,)
    ).fetchall()
    assert checks and all(ok for _, ok, _ in checks), f"{where}: verify_job: {checks}"


def check_announced_chunks(notices, chunks, where):
    """Every chunk the client heard about, in order, is among the committed ones."""
    numbers = [int(m.group(1)) for m in map(CHUNK_NOTICE.match, notices) if m]
    assert numbers == list(range(1, len(numbers) + 1)), f"{where}: notices {notices}"
    assert len(numbers) <= chunks, (
        f"{where}: the client was told {len(numbers)} chunks committed, the database has {chunks}"
    )


def resume_job(conn, job, table, ids, counts, where):
    """The same CALL again finishes the job, committing exactly what was left, once."""
    n, size = conn.execute(
        "SELECT next_index, chunk_size FROM etc_batch.job WHERE job_id = %s", (job,)
    ).fetchone()
    remaining = conn.execute(
        "SELECT coalesce(array_agg(item_key ORDER BY position), '{}') FROM etc_batch.job_item"
        " WHERE job_id = %s AND position >= %s",
        (job, n),
    ).fetchone()[0]
    result = conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
    assert tuple(result) == drained(remaining, math.ceil(len(remaining) / size), "done"), (
        f"{where}: resuming from {n} returned {tuple(result)}"
    )
    status, n, _, _ = check_job(conn, job, table, ids, counts, f"{where}, resumed")
    assert (status, n) == ("done", len(ids)), where
    again = conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
    assert tuple(again) == drained([], 0, "done"), f"{where}: a done job drained again: {again}"
    check_job(conn, job, table, ids, counts, f"{where}, called again")


def test_crash_in_the_middle_of_drains(crash_cluster, crash_report):
    cluster = crash_cluster
    rng = random.Random(f"{SEED}-drain")
    with cluster.connect() as conn:
        conn.execute(NOTE_CHANGE)
    rate = 4000.0  # items per second, a first guess; every round measures it again
    rounds = []
    try:
        for number in range(DRAIN_ROUNDS):
            where = f"seed {SEED}, drain round {number}"
            size = rng.choice([3, 5, 8])
            offset = rng.randrange(size)
            fraction = rng.uniform(0.03, 0.9)
            pick = random.Random(rng.random())
            count = max(200, min(50000, int(rate * DRAIN_SECONDS))) + offset
            a_count = count + count // 4 + 7
            ids = sorted(pick.sample(range(1, a_count + 1), count))
            counts = {"A": a_count, "B": a_count}
            table = f"orders_{number}"
            job = f"crash-drain-{number}"

            admin = cluster.connect()
            create_orders(admin, table, a_count, a_count)
            # every other round from a query: the same job, frozen set-based
            register(admin, job, table, ids, size, from_query=number % 2 == 1)
            call = Call(cluster, "CALL etc_batch.drain_job(%s)", (job,)).start()
            delay = fraction * count / rate
            elapsed, in_flight, _ = crash_after(cluster, admin, call, delay)
            killed = call.killed()

            with cluster.connect() as conn:
                status, n, chunks, _ = check_job(conn, job, table, ids, counts, where)
                check_announced_chunks(call.notices, chunks, where)
                if not killed:
                    assert tuple(call.result) == drained(
                        [str(k) for k in ids], math.ceil(count / size), "done"
                    ), where
                resume_job(conn, job, table, ids, counts, where)

            if not killed:
                rate = count / (call.returned_at - call.sent_at)
            elif n > 0:
                rate = n / elapsed
            rounds.append((n < count, in_flight))
            print(
                f"{where}: {count} items in chunks of {size}, crash {elapsed:.2f}s in:"
                f" {n} committed ({chunks} chunks), call {'killed' if killed else 'finished'},"
                f" transaction open {in_flight}"
            )
    finally:
        mid = sum(1 for interrupted, _ in rounds if interrupted)
        crash_report.append(
            f"drain: {len(rounds)} rounds, {mid} crashed mid-drain"
            f" ({sum(1 for i, f in rounds if i and f)} with a chunk's transaction open),"
            f" {len(rounds) - mid} after completion"
        )
    assert len(rounds) == DRAIN_ROUNDS
    assert 2 * mid >= len(rounds), f"seed {SEED}: only {mid} of {len(rounds)} rounds crashed mid-drain"


# parallel jobs -----------------------------------------------------------------------------

# A parallel job's items against their rows, chunk rows and audit rows, in one snapshot:
# an item of a committed chunk changed once, in the transaction of its audit row, which
# is the one the chunk row names; any other item not audited and as it was created.
PARALLEL_ITEM_CHECK = """
SELECT i.position, i.item_key, c.chunk, c.committed, c.txid AS chunk_txid, o.revision,
       o.status, o.changed_in, a.position AS audited, a.chunk AS audit_chunk, a.txid
  FROM etc_batch.job j
  JOIN etc_batch.job_item i ON i.job_id = j.job_id
  LEFT JOIN etc_batch.job_chunk c
    ON c.job_id = j.job_id AND c.chunk = i.position / j.chunk_size + 1
  LEFT JOIN {t} o ON o.tenant = 'A' AND o.id = i.item_key::integer
  LEFT JOIN etc_batch.job_audit a ON a.job_id = i.job_id AND a.position = i.position
 WHERE j.job_id = %(job)s
   AND (c.chunk IS NOT NULL
        AND CASE WHEN c.committed THEN
                 a.revision_after = i.revision + 1 AND a.chunk = c.chunk AND a.txid = c.txid
             AND o.revision = i.revision + 1 AND o.status = 'cancelled' AND o.changed_in = a.txid
            ELSE
                 a.position IS NULL AND o.revision = i.revision AND o.status = 'pending'
             AND o.changed_in IS NULL
            END) IS NOT TRUE
 ORDER BY i.position
 LIMIT 5"""


def check_parallel_job(conn, job, table, ids, counts, where):
    """Every chunk of a parallel job whole or absent, whatever order its drainers
    committed them in; returns (status, committed chunks, chunks)."""
    t = sql.Identifier(table)
    status, audit_changes, item_changes, problem = conn.execute(
        "SELECT status, audit_changes, item_changes, problem FROM etc_batch.job WHERE job_id = %s",
        (job,),
    ).fetchone()
    assert (audit_changes, item_changes) == (0, 0), where
    chunks, committed = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE committed) FROM etc_batch.job_chunk WHERE job_id = %s",
        (job,),
    ).fetchone()
    assert chunks == math.ceil(len(ids) / conn.execute(
        "SELECT chunk_size FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()[0]), where
    assert status == ("done" if committed == chunks else "pending") or (
        status == "pending" and committed == chunks), f"{where}: {status} {problem}"
    check_rows(conn, job, t, PARALLEL_ITEM_CHECK, counts, where)
    return status, committed, chunks


def test_crash_in_the_middle_of_parallel_drains(crash_cluster, crash_report):
    """Three drainers on one parallel job, the server crashed at a random moment: every
    chunk is whole or absent, whichever drainer had it and in whatever order they
    committed; then one CALL finishes the job, each item exactly once."""
    cluster = crash_cluster
    rng = random.Random(f"{SEED}-parallel")
    with cluster.connect() as conn:
        conn.execute("CREATE OR REPLACE " + NOTE_CHANGE.strip()[len("CREATE "):])
    rate = 8000.0  # items per second for three drainers, a first guess
    rounds = []
    try:
        for number in range(PARALLEL_ROUNDS):
            where = f"seed {SEED}, parallel round {number}"
            size = rng.choice([3, 5, 8])
            fraction = rng.uniform(0.05, 0.9)
            pick = random.Random(rng.random())
            count = max(300, min(60000, int(rate * DRAIN_SECONDS)))
            a_count = count + count // 4 + 7
            ids = sorted(pick.sample(range(1, a_count + 1), count))
            counts = {"A": a_count, "B": a_count}
            table = f"orders_parallel_{number}"
            job = f"crash-parallel-{number}"

            admin = cluster.connect()
            create_orders(admin, table, a_count, a_count)
            register(admin, job, table, ids, size, from_query=number % 2 == 1, parallel=True)
            calls = [Call(cluster, "CALL etc_batch.drain_job(%s)", (job,)).start() for _ in range(3)]
            delay = fraction * count / rate
            elapsed, in_flight, _ = crash_after(cluster, admin, calls[0], delay)
            for c in calls[1:]:
                c.join()
            killed = sum(c.killed() for c in calls)

            with cluster.connect() as conn:
                status, committed, chunks = check_parallel_job(conn, job, table, ids, counts, where)
                at_crash = committed
                heard = sum(1 for c in calls for n in c.notices if CHUNK_NOTICE.match(n))
                assert heard <= committed, f"{where}: told of {heard} chunks, {committed} committed"
                conn.execute("CALL etc_batch.drain_job(%s)", (job,))
                status, committed, chunks = check_parallel_job(
                    conn, job, table, ids, counts, f"{where}, resumed")
                assert (status, committed) == ("done", chunks), where
                again = conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
                assert tuple(again) == drained([], 0, "done"), f"{where}: {again}"
                done_items = conn.execute(
                    "SELECT count(*) FROM etc_batch.job_audit WHERE job_id = %s", (job,)
                ).fetchone()[0]
                assert done_items == count, where

            # the next round's size follows the rate this one showed
            if killed == 0:
                rate = count / (max(c.returned_at for c in calls) - min(c.sent_at for c in calls))
            elif at_crash > 0 and elapsed > 0:
                rate = at_crash * size / elapsed
            rounds.append(killed > 0)
            print(f"{where}: {count} items in chunks of {size}, crash {elapsed:.2f}s in,"
                  f" {killed} of 3 calls killed, transaction open {in_flight}")
    finally:
        mid = sum(1 for r in rounds if r)
        crash_report.append(f"parallel: {len(rounds)} rounds, {mid} crashed mid-drain")
    assert len(rounds) == PARALLEL_ROUNDS
    assert 2 * mid >= len(rounds), f"seed {SEED}: only {mid} of {len(rounds)} rounds crashed mid-drain"


# chains ------------------------------------------------------------------------------------


def check_chain(conn, batch, ids, where):
    """Every step marked done has its one row in `ran` and its one `done` audit row, in
    the same transaction; no other step has either; the done steps are a prefix of the
    chain. Returns the done steps and the audit rows as (step, outcome)."""
    log = conn.execute(
        "SELECT id, status, attempts FROM etc_batch.batch_log WHERE batch = %s ORDER BY id",
        (batch,),
    ).fetchall()
    assert [r[0] for r in log] == ids, where
    assert {status for _, status, _ in log} <= {"done", "pending"}, f"{where}: {log}"
    done = [step for step, status, _ in log if status == "done"]
    assert done == ids[: len(done)], f"{where}: done steps {done} are not a prefix"
    wrong_attempts = [(s, st, a) for s, st, a in log if a != (1 if st == "done" else 0)]
    assert wrong_attempts == [], f"{where}: attempts {wrong_attempts}"

    ran = conn.execute(
        "SELECT step, count(*), min(txid) FROM ran WHERE step = ANY(%s::bigint[]) GROUP BY step",
        (ids,),
    ).fetchall()
    assert {step: n for step, n, _ in ran} == {step: 1 for step in done}, (
        f"{where}: rows in ran {sorted((s, n) for s, n, _ in ran)} for done steps {done}"
    )
    ran_txid = {step: txid for step, _, txid in ran}

    audit = conn.execute(
        "SELECT step_id, outcome, txid FROM etc_batch.step_audit WHERE batch = %s ORDER BY audit_id",
        (batch,),
    ).fetchall()
    done_audit = [(step, txid) for step, outcome, txid in audit if outcome == "done"]
    assert sorted(step for step, _ in done_audit) == done, f"{where}: done audit rows {done_audit}"
    assert all(ran_txid[step] == txid for step, txid in done_audit), (
        f"{where}: a step's write and its audit row were committed apart"
    )
    assert all(outcome in ("done", "skipped") for _, outcome, _ in audit), f"{where}: {audit}"
    return done, [(step, outcome) for step, outcome, _ in audit]


def run_chain(conn, first):
    notices = []

    def keep(diag):
        notices.append(diag.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        started = time.monotonic()
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
        return notices, time.monotonic() - started
    finally:
        conn.remove_notice_handler(keep)


def test_crash_in_the_middle_of_chains(crash_cluster, crash_report):
    cluster = crash_cluster
    rng = random.Random(f"{SEED}-chain")
    with cluster.connect() as conn:
        conn.execute(
            "CREATE TABLE ran (step bigint NOT NULL, txid bigint NOT NULL DEFAULT txid_current())"
        )
    # seconds per step besides its sleep, a first guess; every chain of trivial steps
    # measures it again
    step_cost = 0.003
    rounds = []
    try:
        for number in range(CHAIN_ROUNDS):
            where = f"seed {SEED}, chain round {number}"
            batch = f"crash_chain_{number}"
            # Most chains sleep in some steps after their insert, so that a crash there
            # finds the step's write uncommitted; the others are hundreds of trivial
            # steps, where the crash lands on the runner's own work and its commits.
            quick = rng.random() < 0.35
            spread = rng.random()
            if quick:
                length = max(100, min(5000, int(QUICK_SECONDS / step_cost * (0.8 + 0.4 * spread))))
            else:
                length = 20 + int(20 * spread)
            ids, step = [], (number + 1) * 100000
            for _ in range(length):
                step += rng.choice([1, 1, 2, 7])
                ids.append(step)
            sleeps = {} if quick else {
                s: round(rng.uniform(0.03, 0.2), 3) for s in ids if rng.random() < 0.3
            }
            order = list(ids)
            rng.shuffle(order)
            fraction = rng.uniform(0.03, 0.9)

            admin = cluster.connect()
            commands = [
                f"INSERT INTO ran(step) VALUES ({s})"
                + (f"; SELECT pg_sleep({sleeps[s]})" if s in sleeps else "")
                for s in order
            ]
            added = admin.execute(
                "SELECT etc_batch.add_step(%s, c, i) FROM unnest(%s::text[], %s::bigint[]) u(c, i)",
                (batch, commands, order),
            ).fetchall()
            assert [a for a, in added] == order, where
            call = Call(cluster, "CALL etc_batch.exec_batch_from_id(%s)", (ids[0],)).start()
            delay = fraction * (sum(sleeps.values()) + length * step_cost)
            elapsed, in_flight, wait_event = crash_after(cluster, admin, call, delay)
            killed = call.killed()

            with cluster.connect() as conn:
                done, audit = check_chain(conn, batch, ids, where)
                assert all(outcome == "done" for _, outcome in audit), f"{where}: {audit}"
                announced = [
                    int(m.group(1)) for m in map(STEP_NOTICE.match, call.notices) if m
                ]
                assert announced == done[: len(announced)], (
                    f"{where}: the client was told {announced} committed, the database has {done}"
                )
                if not killed:
                    assert done == ids, where

                notices, took = run_chain(conn, ids[0])
                assert notices == [
                    f'step {s} of batch "{batch}" is already done, skipping' for s in done
                ] + [f'step {s} of batch "{batch}" committed' for s in ids[len(done):]], (
                    f"{where}: resuming after {done}: {notices}"
                )
                finished, audit = check_chain(conn, batch, ids, f"{where}, resumed")
                assert finished == ids, where
                assert Counter(audit) == Counter(
                    [(s, "done") for s in ids] + [(s, "skipped") for s in done]
                ), f"{where}: audit after resuming {audit}"

                again, _ = run_chain(conn, ids[0])
                assert again == [
                    f'step {s} of batch "{batch}" is already done, skipping' for s in ids
                ], where
                _, audit = check_chain(conn, batch, ids, f"{where}, called again")
                assert Counter(audit) == Counter(
                    [(s, "done") for s in ids] + [(s, "skipped") for s in done + ids]
                ), f"{where}: audit after calling again {audit}"

            if quick:
                # the resuming call went through every step, skipping or running it
                step_cost = max(0.0001, took / length)
            # in a sleep, the step's insert is written and not committed
            sleeping = in_flight and wait_event == "PgSleep"
            rounds.append((len(done) < length, in_flight, sleeping))
            print(
                f"{where}: {length} steps, {len(sleeps)} sleeping, crash {elapsed:.2f}s in:"
                f" {len(done)} done, call {'killed' if killed else 'finished'},"
                f" transaction open {in_flight}, inside a sleep {sleeping}"
            )
    finally:
        mid = sum(1 for interrupted, _, _ in rounds if interrupted)
        crash_report.append(
            f"chain: {len(rounds)} rounds, {mid} crashed mid-chain"
            f" ({sum(1 for i, f, _ in rounds if i and f)} with a step's transaction open,"
            f" {sum(1 for i, _, z in rounds if i and z)} of them inside a step's sleep),"
            f" {len(rounds) - mid} after completion"
        )
    assert len(rounds) == CHAIN_ROUNDS
    assert 2 * mid >= len(rounds), f"seed {SEED}: only {mid} of {len(rounds)} rounds crashed mid-chain"


# a chunk written whole but not committed -----------------------------------------------------

HOLD_KEY = 55470

# A deferred trigger runs at COMMIT, after the chunk's change, audit rows and checkpoint
# are all written: waiting there on a lock the test holds stops the chunk at the last
# moment before its commit, for as long as the test likes.
HOLD_AT_COMMIT = f"""
CREATE FUNCTION hold_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({HOLD_KEY});
    RETURN NULL;
END
$$"""


def test_crash_with_a_chunk_written_but_not_committed(crash_cluster, crash_report):
    """A crash that finds a chunk's change, audit rows and checkpoint written and
    flushed to the data files by a CHECKPOINT, only the commit missing: recovery must
    treat all of it as never having happened.

    etc_batch.crash_at does not fit here: it ends one backend with FATAL, which aborts
    the chunk's transaction cleanly and leaves the server running, so a server crash
    after it would find no chunk in flight (tests/integration covers its three points)."""
    cluster = crash_cluster
    dbname = "etc_batch_crash_held"
    where = "chunk held at commit"
    with cluster.connect("postgres") as conn:
        conn.execute(f"CREATE DATABASE {dbname}")
    admin = cluster.connect(dbname)
    admin.execute("CREATE EXTENSION etc_batch")
    admin.execute(NOTE_CHANGE)
    admin.execute(HOLD_AT_COMMIT)
    table, job, size = "orders_held", "crash-held", 5
    ids = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53]
    counts = {"A": 60, "B": 60}
    create_orders(admin, table, 60, 60)
    admin.execute(
        "CREATE CONSTRAINT TRIGGER hold_at_commit AFTER UPDATE ON orders_held"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold_at_commit()"
    )
    register(admin, job, table, ids, size)
    first = admin.execute("CALL etc_batch.drain_job(%s, 1)", (job,)).fetchone()
    assert tuple(first) == drained([str(k) for k in ids[:5]], 1, "pending")

    gate = cluster.connect(dbname)
    gate.execute("SELECT pg_advisory_lock(%s::bigint)", (HOLD_KEY,))
    call = Call(cluster, "CALL etc_batch.drain_job(%s)", (job,), dbname=dbname).start()

    def held():
        assert not call.finished.is_set(), f"the drain returned: {call.result} {call.error!r}"
        return admin.execute(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = %s AND locktype = 'advisory'"
            " AND objid = %s::bigint::oid AND NOT granted)",
            (call.pid, HOLD_KEY),
        ).fetchone()[0]

    wait_until(held, "the drainer to wait at its chunk's commit")
    # what the held transaction has written: audit rows and the checkpoint's update
    written = {
        r[0]
        for r in admin.execute(
            "SELECT relation::regclass::text FROM pg_locks WHERE pid = %s AND granted"
            " AND locktype = 'relation' AND mode = 'RowExclusiveLock'",
            (call.pid,),
        )
    }
    # the job's own audit partition: a chunk never writes through the parent
    audit = admin.execute(
        "SELECT 'etc_batch.job_audit_chunk_' || job_number FROM etc_batch.job WHERE job_id = %s",
        (job,)
    ).fetchone()[0]
    assert {audit, "etc_batch.job", table} <= written, written
    assert "etc_batch.job_audit_chunk" not in written, written
    query = admin.execute(
        "SELECT query FROM pg_stat_activity WHERE pid = %s", (call.pid,)
    ).fetchone()[0]
    assert "chunk 2 of 4" in query, query
    # the uncommitted row versions go to the data files, not only to the WAL
    admin.execute("CHECKPOINT")
    admin.close()
    # the gate stays shut until the crash ends its session
    cluster.crash_and_restart()
    call.join()
    gate.close()
    assert call.killed(), "the held chunk's CALL survived the crash"
    assert not any(CHUNK_NOTICE.match(n) for n in call.notices), call.notices

    with cluster.connect(dbname) as conn:
        status, n, chunks, _ = check_job(conn, job, table, ids, counts, where)
        assert (status, n, chunks) == ("pending", 5, 1), where
        resume_job(conn, job, table, ids, counts, where)
    crash_report.append("held at commit: the written, checkpointed, uncommitted chunk was rolled back")
