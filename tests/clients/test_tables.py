"""Jobs on the tables a DBA has, driven by real clients (psycopg, straight to PostgreSQL
and through PgBouncer) while other clients work on the same rows.

- A table with no tenant and no revision column, changed by the application while a
  drain runs: the row digest catches every change, with on_drift => 'stop' (the job
  stops at the first) and 'skip' (each is left as the application made it, recorded,
  and the job goes on); the job never overwrites a row the application changed.
- A partitioned table, items in three partitions, drained in parallel by three clients
  while their backends are killed at random moments: every approved row changed once.
- A partitioned table purged (action delete) or moved to an archive (action move) in
  parallel by three clients killed at random, while the application holds rows ahead of
  the drain: a held row is never deleted; every other approved row deleted once, moved
  once, and kept whole with the audit. Its revert, drained the same way while the
  application takes some deleted keys again, puts every other row back exactly once.
- A partitioned table backfilled, computed from the row (set_expressions) or from a
  join (set_from_query), in parallel by three clients killed at random while the
  application holds rows: a held row is never changed; every other approved row
  changed once, to its value; the revert sets each back once, its revert again.
- register_remainder after a conflict: what was not changed, approved again in one
  call, drained to the end; what it leaves out (the drifted row, a deleted one) named
  in job_left_out and told to the client, every approved item accounted for, and the
  drifted one approved later by a call of its own.
- A table loaded and never analyzed, chunks of 5,000: no chunk reads the table whole.
- A drainer pacing itself is at work: job_progress shows it, the doctor says nothing
  of a job stopped half-way; the rate and the estimated finish leave paused time out.
- A drain that fails for another reason than a conflict is recorded where job_summary,
  job_progress and the doctor show it.
- A job reverted while the application keeps updating other rows of the same table:
  the revert, drained by three clients whose backends are killed at random, sets back
  every item it approved exactly once, and nothing else; the rows the application had
  changed since the job are left out and named, never overwritten.

ETC_BATCH_TABLES_SEED=<seed> repeats the random choices of a run (printed on failure).
"""

import json
import os
import random
import secrets
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg import errors, sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import wait_until  # noqa: E402

SEED = int(os.environ.get("ETC_BATCH_TABLES_SEED", secrets.randbits(32)))


def tag(label):
    return f"{label}_{secrets.token_hex(3)}"


def audit_counts(pg, job):
    """How many audit rows each approved item has, by key text, and how many of them
    say skipped."""
    rows = pg.admin.execute(
        "SELECT item_key, count(*), count(*) FILTER (WHERE outcome = 'skipped') "
        "FROM etc_batch.job_audit_items WHERE job_id = %s GROUP BY item_key", (job,)).fetchall()
    return Counter({k: n for k, n, _ in rows}), {k for k, _, s in rows if s}


def doctor_rows(pg, job):
    return pg.admin.execute(
        "SELECT status, detail FROM etc_batch.doctor() WHERE check_name = %s",
        (f"job {job}",)).fetchall()


def drain_while_killed(pg, job, rng, pause=(0.05, 0.4)):
    """Three clients drain parallel job `job`, two chunks a call, until it is done, while
    their backends are killed at random moments (a pause of `pause` seconds between
    kills); a killed drainer reconnects and goes on. Fails the test on any other error,
    if the job does not finish within 120 s, or if fewer than 3 kills landed; returns how
    many did."""
    pids, done, failures = {}, threading.Event(), []

    def drainer(n):
        while not done.is_set():
            try:
                conn = pg.direct()
                pids[n] = conn.info.backend_pid
                while not done.is_set():
                    r = conn.execute("CALL etc_batch.drain_job(%s, 2)", (job,)).fetchone()
                    if r[4] == "done":
                        done.set()
            except psycopg.OperationalError:
                pass  # its backend was terminated: a new connection goes on
            except BaseException as e:  # kept for the assertion below
                failures.append(e)
                done.set()

    threads = [threading.Thread(target=drainer, args=(n,), daemon=True) for n in range(3)]
    for th in threads:
        th.start()
    kills = 0
    deadline = time.monotonic() + 120
    while not done.is_set() and time.monotonic() < deadline:
        time.sleep(rng.uniform(*pause))
        victim = pids.get(rng.randrange(3))
        if victim and not done.is_set():
            if pg.admin.execute("SELECT pg_terminate_backend(%s)", (victim,)).fetchone()[0]:
                kills += 1
    finished = done.is_set()
    done.set()
    for th in threads:
        th.join(60)
        assert not th.is_alive()
    assert failures == [], (SEED, failures)
    assert finished, f"job {job} did not finish (seed {SEED})"
    assert kills >= 3, f"too few kills to prove anything: {kills} (seed {SEED})"
    print(f"{kills} drainers killed (seed {SEED})")
    return kills


def by_month(pg, name):
    """Three partitions of table `name` (partitioned by range of `at`): January to March
    2026."""
    for month in (1, 2, 3):
        pg.admin.execute(sql.SQL(
            "CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(f"{name}_{month}"), sql.Identifier(name),
                sql.Literal(f"2026-0{month}-01 00:00+00"), sql.Literal(f"2026-0{month + 1}-01 00:00+00")))


def application(pg, act, pause=0.02):
    """Starts the application: on a connection of its own, `act(conn)` every `pause`
    seconds until stopped, each id it returns (None: nothing done) kept. Returns the ids,
    and what stops it."""
    done, stop = [], threading.Event()

    def work():
        conn = pg.direct()
        while not stop.is_set():
            i = act(conn)
            if i is not None:
                done.append(i)
            time.sleep(pause)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()

    def stopped():
        stop.set()
        thread.join(30)

    return done, stopped


def application_holding(pg, t, rng, unchanged=None):
    """Starts the application on table `t`: it holds approved events (every id not a
    multiple of 3, from 'old' to 'held'), one at random every 20 ms, until stopped; with
    `unchanged(id)`, an SQL condition and its parameters, only events it holds. Returns
    the ids held, and what stops it."""
    def hold(conn):
        i = rng.choice([i for i in range(1, 3001) if i % 3 != 0])
        extra, params = unchanged(i) if unchanged else (sql.SQL(""), ())
        held = conn.execute(sql.SQL("UPDATE {} SET state = 'held' WHERE id = %s AND state = 'old'{}")
                            .format(t, extra), (i, *params)).rowcount
        return i if held else None

    return application(pg, hold)


def lingering(pg, name, event):
    """Each statement of `event` (UPDATE, DELETE) on table `name`, and so each chunk's,
    lingers before its commit, where most kills land."""
    pg.admin.execute(sql.SQL(
        "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM pg_sleep(0.08); RETURN NULL; END $$").format(fn=sql.Identifier(f"{name}_linger")))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER {} AFTER {} ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}()").format(
            sql.Identifier(f"linger_{event.lower()}"), sql.SQL(event), sql.Identifier(name),
            sql.Identifier(f"{name}_linger")))


def record_status_changes(pg, name):
    """From now on, every update of table `name` that commits is recorded in
    <name>_log(id, was, became), with the status it replaced; returns that table."""
    log = sql.Identifier(f"{name}_log")
    pg.admin.execute(sql.SQL("CREATE TABLE {} (id bigint, was text, became text)").format(log))
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO {log} VALUES (NEW.id, OLD.status, NEW.status); RETURN NULL; END $$").format(
            fn=sql.Identifier(f"{name}_record"), log=log))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER recorded AFTER UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
            sql.Identifier(name), sql.Identifier(f"{name}_record")))
    return log


class Accounts:
    """accounts_<tag>(id bigint PRIMARY KEY, plan text, balance numeric): no tenant, no
    revision column, ids 1..n on plan 'basic'."""

    def __init__(self, pg, n):
        self.pg = pg
        self.name = tag("accounts")
        self.ident = sql.Identifier(self.name)
        pg.admin.execute(sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, plan text NOT NULL, balance numeric NOT NULL)"
        ).format(self.ident))
        pg.admin.execute(sql.SQL(
            "INSERT INTO {} SELECT g, 'basic', g * 10 FROM generate_series(1, %s) g"
        ).format(self.ident), (n,))

    def register(self, conn, job, ids, chunk_size, on_drift="stop"):
        return conn.execute(
            "SELECT job_id, created, items, chunks FROM etc_batch.register_job("
            "%s, NULL, %s::regclass, %s::jsonb, %s, '{\"plan\": \"standard\"}', "
            "tenant_column => NULL, revision_column => NULL, on_drift => %s)",
            (job, self.name, json.dumps([{"id": i} for i in ids]), chunk_size, on_drift),
        ).fetchone()

    def rows(self):
        return {r[0]: (r[1], r[2]) for r in self.pg.admin.execute(
            sql.SQL("SELECT id, plan, balance FROM {}").format(self.ident))}


@pytest.mark.parametrize("on_drift", ["stop", "skip"])
def test_an_application_changing_a_table_without_tenant_or_revision_during_a_drain(
        client, on_drift):
    """The application pays into accounts just ahead of the drain, on a table with
    neither a tenant nor a revision column: each of its changes is caught by the row
    digest. With 'stop' the job stops in conflict at the first changed item it reaches;
    with 'skip' every changed item is left as the application made it, audited as
    skipped with the row found, and the rest is changed, each item once."""
    pg = client.pg
    rng = random.Random(SEED)
    accounts = Accounts(pg, 600)
    approved = list(range(1, 501))
    job = tag(f"app_{on_drift}")
    conn = client.connect()
    assert accounts.register(conn, job, approved, 20, on_drift) == (job, True, 500, 25)
    # a slow drain, so that the application has time to act ahead of it
    conn.execute("SELECT etc_batch.pace_job(%s, 1000)", (job,))

    result, failure = {}, {}

    def drain():
        try:
            result["row"] = client.connect().execute(
                "CALL etc_batch.drain_job(%s)", (job,)).fetchone()
        except psycopg.Error as e:
            failure["error"] = e

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    app = client.connect()
    changed = set()
    while thread.is_alive():
        committed = app.execute("SELECT committed FROM etc_batch.job_progress WHERE job_id = %s",
                                (job,)).fetchone()[0]
        # a row well ahead of the drain, approved or not; a payment changes only a row
        # still on the plan approved (the drain may have changed it meanwhile)
        target = committed + rng.randint(60, 140)
        if target <= 600:
            row = app.execute(sql.SQL(
                "UPDATE {} SET balance = balance + 1 WHERE id = %s AND plan = 'basic' RETURNING id"
            ).format(accounts.ident), (target,)).fetchone()
            if row:
                changed.add(row[0])
        time.sleep(0.02)
    thread.join(60)
    changed_approved = changed & set(approved)
    assert changed_approved, f"the application changed no approved row (seed {SEED})"

    rows = accounts.rows()
    # the job never overwrote a row the application changed, nor touched a row not approved
    assert all(rows[i][0] == "basic" for i in changed), (SEED, changed)
    assert all(rows[i][0] == "basic" for i in range(501, 601))
    counts, skipped = audit_counts(pg, job)
    assert set(counts.values()) <= {1}, counts
    standard = {i for i, (plan, _) in rows.items() if plan == "standard"}
    if on_drift == "stop":
        assert isinstance(failure.get("error"), errors.IntegrityConstraintViolation), (SEED, result)
        first = min(changed_approved)
        assert failure["error"].diag.message_detail.startswith(f"Item {first} ("), failure["error"]
        # everything before the changed item's chunk committed, nothing from it on
        assert standard == set(range(1, (first - 1) // 20 * 20 + 1)), (SEED, first)
        assert skipped == set()
        status = pg.admin.execute("SELECT status FROM etc_batch.job WHERE job_id = %s",
                                  (job,)).fetchone()[0]
        assert status == "conflict"
    else:
        assert failure == {} and result["row"][4] == "done", (SEED, failure)
        assert standard == set(approved) - changed_approved, SEED
        assert {int(k) for k in skipped} == changed_approved, SEED
        assert counts == Counter({str(i): 1 for i in approved})
        summary = pg.admin.execute(
            "SELECT status, committed, matching, skipped FROM etc_batch.job_summary(%s)",
            (job,)).fetchone()
        assert summary == ("done", 500, 500 - len(changed_approved), len(changed_approved))
        # what was found is the row as the application left it
        found = dict(pg.admin.execute(
            "SELECT item_key::bigint, (found ->> 'balance')::numeric FROM etc_batch.job_audit_items "
            "WHERE job_id = %s AND outcome = 'skipped'", (job,)).fetchall())
        assert found == {i: rows[i][1] for i in changed_approved}


def test_a_partitioned_table_drained_in_parallel_while_drainers_are_killed(pg):
    """events is partitioned by month into three partitions; 2,000 approved events lie
    in all three. Three clients drain the parallel job while their backends are killed
    at random moments (mostly inside a chunk, whose statement lingers before its commit)
    and they reconnect: in the end every approved row was updated exactly once (a
    trigger counts the updates that committed), and no other row."""
    rng = random.Random(SEED)
    name = tag("events")
    t = sql.Identifier(name)
    counted = sql.Identifier(f"{name}_updates")
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (at timestamptz, id bigint, state text NOT NULL DEFAULT 'new', "
        "PRIMARY KEY (at, id)) PARTITION BY RANGE (at)").format(t))
    by_month(pg, name)
    pg.admin.execute(sql.SQL(
        "INSERT INTO {} (at, id) SELECT timestamptz '2026-01-01 00:00+00' "
        "+ (g * interval '1 second' * 2500), g FROM generate_series(1, 3000) g").format(t))
    pg.admin.execute(sql.SQL("CREATE TABLE {} (id bigint, n int NOT NULL DEFAULT 1)").format(counted))
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO {c} (id) VALUES (NEW.id); RETURN NEW; END $$").format(
            fn=sql.Identifier(f"{name}_count"), c=counted))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER counted AFTER UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
            t, sql.Identifier(f"{name}_count")))
    lingering(pg, name, "UPDATE")
    partitions = pg.admin.execute(sql.SQL(
        "SELECT count(DISTINCT tableoid) FROM {} WHERE id % 3 <> 0").format(t)).fetchone()[0]
    assert partitions == 3
    job = tag("events_job")
    row = pg.admin.execute(
        "SELECT items, chunks FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, "
        "format('SELECT at, id FROM %%I WHERE id %%%% 3 <> 0', %s::text), 25, "
        "'{\"state\": \"archived\"}', tenant_column => NULL, revision_column => NULL, "
        "parallel => true)", (job, name, name)).fetchone()
    assert row == (2000, 80)

    drain_while_killed(pg, job, rng)

    updates = dict(pg.admin.execute(sql.SQL("SELECT id, sum(n) FROM {} GROUP BY id").format(counted)))
    assert updates == {i: 1 for i in range(1, 3001) if i % 3 != 0}, SEED
    states = Counter(r[0] for r in pg.admin.execute(sql.SQL("SELECT state FROM {}").format(t)))
    assert states == Counter({"archived": 2000, "new": 1000})
    counts, _ = audit_counts(pg, job)
    assert len(counts) == 2000 and set(counts.values()) == {1}
    checks = pg.admin.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert checks and all(ok for _, ok in checks), checks


@pytest.mark.parametrize("action", ["delete", "move"])
def test_a_partitioned_table_purged_in_parallel_while_the_application_works_and_drainers_are_killed(
        pg, action):
    """events is partitioned by month into three partitions; 2,000 approved events lie in
    all three, to be deleted (or moved to an archive table). While three clients drain
    the parallel job and their backends are killed at random moments, the application
    holds some approved events (state 'held') just ahead of the drain. In the end: every
    held event is still there, skipped, never deleted; every other approved event was
    deleted exactly once (a trigger counts the deletes that committed), and, for a move,
    is in the archive exactly once, as it was; each chunk's audit keeps every deleted row
    whole, cast back to the table's row type equal to the row deleted; no other row was
    touched; verify_job passes and job_report calls each deleted row so."""
    rng = random.Random(SEED)
    name = tag("purged")
    t = sql.Identifier(name)
    archive = sql.Identifier(f"{name}_archive")
    counted = sql.Identifier(f"{name}_deletes")
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (at timestamptz, id bigint, state text NOT NULL DEFAULT 'old', "
        "body jsonb NOT NULL, PRIMARY KEY (at, id)) PARTITION BY RANGE (at)").format(t))
    by_month(pg, name)
    pg.admin.execute(sql.SQL(
        "INSERT INTO {} (at, id, body) SELECT timestamptz '2026-01-01 00:00+00' "
        "+ (g * interval '1 second' * 2500), g, jsonb_build_object('n', g, 'tags', ARRAY['a', g::text]) "
        "FROM generate_series(1, 3000) g").format(t))
    before = {r[1]: r for r in pg.admin.execute(sql.SQL("SELECT at, id, state, body FROM {}").format(t))}
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (at timestamptz, id bigint, state text, body jsonb, "
        "archived_at timestamptz NOT NULL DEFAULT now())").format(archive))
    pg.admin.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(counted))
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO {c} (id) VALUES (OLD.id); RETURN OLD; END $$").format(
            fn=sql.Identifier(f"{name}_count"), c=counted))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER counted AFTER DELETE ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
            t, sql.Identifier(f"{name}_count")))
    lingering(pg, name, "DELETE")
    job = tag("purge_job")
    row = pg.admin.execute(
        "SELECT items, chunks FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, "
        "format('SELECT at, id FROM %%I WHERE id %%%% 3 <> 0', %s::text), 25, NULL, "
        "'{\"state\": \"old\"}', tenant_column => NULL, revision_column => NULL, "
        "guard => 'columns', parallel => true, on_drift => 'skip', action => %s, "
        "archive => %s::regclass)",
        (job, name, name, action, f"{name}_archive" if action == "move" else None)).fetchone()
    assert row == (2000, 80)

    # the application holds approved events, a few at a time, while the job runs
    held, stopped = application_holding(pg, t, rng)
    try:
        drain_while_killed(pg, job, rng)
    finally:
        stopped()

    remaining = {r[0]: r[1] for r in pg.admin.execute(sql.SQL("SELECT id, state FROM {}").format(t))}
    deletes = Counter(r[0] for r in pg.admin.execute(sql.SQL("SELECT id FROM {}").format(counted)))
    counts, skipped = audit_counts(pg, job)
    assert len(counts) == 2000 and set(counts.values()) == {1}, SEED
    skipped_ids = {int(json.loads(k)[1]) for k in skipped}
    approved = {i for i in range(1, 3001) if i % 3 != 0}
    # every deleted event was deleted once, an approved one the application had not held
    assert set(deletes.values()) <= {1}, SEED
    assert set(deletes) == approved - skipped_ids, SEED
    # a row the application held before its chunk deleted it was skipped; one it could
    # not hold any more was gone already
    assert held and skipped_ids == set(held), SEED
    # what is left: the events never approved, untouched, and every skipped one, held
    assert {i for i in remaining if i % 3 == 0} == {i for i in range(1, 3001) if i % 3 == 0}
    assert all(remaining[i] == "old" for i in remaining if i % 3 == 0)
    assert {i for i in remaining if i % 3 != 0} == skipped_ids
    assert all(remaining[i] == "held" for i in skipped_ids)
    # each deleted row kept whole with its chunk's audit
    kept = {r[1]: r for r in pg.admin.execute(sql.SQL(
        "SELECT (k::{t}).at, (k::{t}).id, (k::{t}).state, (k::{t}).body "
        "FROM etc_batch.job_audit_chunk a, unnest(a.kept) k "
        "WHERE a.job_id = %s AND k IS NOT NULL").format(t=t), (job,))}
    assert kept == {i: before[i] for i in deletes}, SEED
    if action == "move":
        moved = Counter(r[0] for r in pg.admin.execute(sql.SQL("SELECT id FROM {}").format(archive)))
        assert moved == Counter(set(deletes)), SEED
        rows = {r[1]: r for r in pg.admin.execute(
            sql.SQL("SELECT at, id, state, body FROM {}").format(archive))}
        assert rows == {i: before[i] for i in deletes}, SEED
    states = Counter(r[0] for r in pg.admin.execute(
        "SELECT state FROM etc_batch.job_report(%s)", (job,)))
    gone = "deleted by the job" if action == "delete" else "moved to the archive"
    assert states == Counter({gone: len(deletes), "skipped": len(skipped_ids)}), SEED
    checks = pg.admin.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert checks and all(ok for _, ok in checks), checks

    # the revert, drained the same way while the application takes some of the deleted
    # keys again: every other deleted row put back exactly once, as it was (a move's
    # taken out of the archive), a taken key never overwritten
    inserted = sql.Identifier(f"{name}_inserts")
    pg.admin.execute(sql.SQL("CREATE TABLE {} (id bigint, state text)").format(inserted))
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO {c} VALUES (NEW.id, NEW.state); RETURN NULL; END $$").format(
            fn=sql.Identifier(f"{name}_count_inserts"), c=inserted))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER inserted AFTER INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
            t, sql.Identifier(f"{name}_count_inserts")))
    lingering(pg, name, "INSERT")
    back = tag("unpurge_job")
    r = pg.admin.execute("SELECT items FROM etc_batch.register_revert(%s, %s)", (job, back)).fetchone()
    assert r == (len(deletes),)
    def take(conn):
        i = rng.choice(sorted(deletes))
        inserted = conn.execute(sql.SQL("INSERT INTO {} (at, id, state, body) VALUES (%s, %s, 'new', '{{}}') "
                                        "ON CONFLICT DO NOTHING").format(t), (before[i][0], i)).rowcount
        return i if inserted else None

    taken, stopped = application(pg, take, pause=0.05)
    try:
        drain_while_killed(pg, back, rng)
    finally:
        stopped()
    restored = Counter(r[0] for r in pg.admin.execute(
        sql.SQL("SELECT id FROM {} WHERE state <> 'new'").format(inserted)))
    assert taken and set(restored.values()) == {1}, SEED
    assert set(restored) == set(deletes) - set(taken), SEED
    rows = {r[1]: r for r in pg.admin.execute(sql.SQL("SELECT at, id, state, body FROM {}").format(t))}
    assert all(rows[i] == before[i] for i in restored), SEED
    assert all(rows[i][2] == "new" for i in taken), SEED
    if action == "move":
        archived = Counter(r[0] for r in pg.admin.execute(sql.SQL("SELECT id FROM {}").format(archive)))
        assert archived == Counter(set(taken)), SEED
    states = Counter(r[0] for r in pg.admin.execute(
        "SELECT state FROM etc_batch.job_report(%s)", (back,)))
    assert states == Counter({"matching": len(restored), "skipped": len(set(taken))}), SEED
    checks = pg.admin.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (back,)).fetchall()
    assert checks and all(ok for _, ok in checks), checks


@pytest.mark.parametrize("kind", ["set_expressions", "set_from_query"])
def test_a_partitioned_table_backfilled_in_parallel_while_the_application_works_and_drainers_are_killed(
        pg, kind):
    """events is partitioned by month into three partitions; 2,000 approved events lie in
    all three, to be backfilled: `cents` computed from the row (set_expressions) or
    `region` read from each event's customer through a join (set_from_query). While
    three clients drain the parallel job and their backends are killed at random
    moments, the application holds some approved events (state 'held') just ahead of
    the drain. In the end: every held event is untouched and skipped; every other
    approved event was updated exactly once (a trigger counts the updates that
    committed) to its value; no other row was touched; verify_job passes. Then the
    revert sets every changed event back to what it held, exactly once, and the revert
    of that revert sets the values again."""
    rng = random.Random(SEED)
    name = tag("filled")
    t = sql.Identifier(name)
    customers = sql.Identifier(f"{name}_customers")
    counted = sql.Identifier(f"{name}_updates")
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (customer_id int PRIMARY KEY, region text NOT NULL)").format(customers))
    pg.admin.execute(sql.SQL(
        "INSERT INTO {} SELECT g, (ARRAY['eu', 'us', 'apac'])[1 + g % 3] "
        "FROM generate_series(0, 9) g").format(customers))
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (at timestamptz, id bigint, state text NOT NULL DEFAULT 'old', "
        "customer_id int NOT NULL, total numeric(10, 2) NOT NULL, cents bigint, region text, "
        "PRIMARY KEY (at, id)) PARTITION BY RANGE (at)").format(t))
    by_month(pg, name)
    pg.admin.execute(sql.SQL(
        "INSERT INTO {} (at, id, customer_id, total, region) "
        "SELECT timestamptz '2026-01-01 00:00+00' + (g * interval '1 second' * 2500), g, g % 10, "
        "g * 1.25, CASE WHEN g % 7 = 0 THEN 'legacy' END FROM generate_series(1, 3000) g").format(t))
    before = {r[0]: r[1:] for r in pg.admin.execute(
        sql.SQL("SELECT id, cents, region FROM {}").format(t))}
    pg.admin.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(counted))
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO {c} (id) VALUES (NEW.id); RETURN NULL; END $$").format(
            fn=sql.Identifier(f"{name}_count"), c=counted))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER counted AFTER UPDATE ON {} FOR EACH ROW "
        "WHEN (OLD.state = NEW.state) EXECUTE FUNCTION {}()").format(
            t, sql.Identifier(f"{name}_count")))
    lingering(pg, name, "UPDATE")
    job = tag("backfill_job")
    if kind == "set_expressions":
        items = sql.SQL("SELECT at, id FROM {} WHERE id % 3 <> 0").format(t)
        change = "set_expressions => '{\"cents\": \"round(total * 100)::bigint\"}'"
        column = "cents"
        value = {i: int(i * 125) for i in range(1, 3001)}
    else:
        items = sql.SQL(
            "SELECT e.at, e.id, c.region FROM {} e JOIN {} c USING (customer_id) "
            "WHERE e.id % 3 <> 0").format(t, customers)
        change = "set_from_query => '{region}'"
        column = "region"
        value = {i: ["eu", "us", "apac"][(i % 10) % 3] for i in range(1, 3001)}
    row = pg.admin.execute(
        "SELECT items, chunks FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, "
        f"%s, 25, NULL, '{{\"state\": \"old\"}}', tenant_column => NULL, "
        f"revision_column => NULL, guard => 'columns', parallel => true, on_drift => 'skip', {change})",
        (job, name, items.as_string(pg.admin))).fetchone()
    assert row == (2000, 80)

    # only an event the job has not changed yet is held: one it has is no longer
    held, stopped = application_holding(pg, t, rng, lambda i: (
        sql.SQL(" AND {} IS NOT DISTINCT FROM %s").format(sql.Identifier(column)),
        (before[i][0 if column == "cents" else 1],)))
    try:
        drain_while_killed(pg, job, rng)
    finally:
        stopped()

    col = sql.Identifier(column)
    now = {r[0]: r[1:] for r in pg.admin.execute(
        sql.SQL("SELECT id, state, {} FROM {}").format(col, t))}
    updates = Counter(r[0] for r in pg.admin.execute(sql.SQL("SELECT id FROM {}").format(counted)))
    counts, skipped = audit_counts(pg, job)
    assert len(counts) == 2000 and set(counts.values()) == {1}, SEED
    skipped_ids = {int(json.loads(k)[1]) for k in skipped}
    approved = {i for i in range(1, 3001) if i % 3 != 0}
    assert held and skipped_ids == set(held), SEED
    changed = approved - skipped_ids
    assert set(updates.values()) == {1} and set(updates) == changed, SEED
    position = 0 if column == "cents" else 1
    for i, (state, v) in now.items():
        if i in changed:
            assert (state, v) == ("old", value[i]), (i, SEED)
        else:
            assert v == before[i][position], (i, SEED)
    checks = pg.admin.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert checks and all(ok for _, ok in checks), checks

    # the revert: each changed event back to what it held, once; and forth again
    pg.admin.execute(sql.SQL("TRUNCATE {}").format(counted))
    back = tag("backfill_back")
    r = pg.admin.execute("SELECT items FROM etc_batch.register_revert(%s, %s)", (job, back)).fetchone()
    assert r == (len(changed),)
    drain_while_killed(pg, back, rng)
    now = {r[0]: r[1] for r in pg.admin.execute(sql.SQL("SELECT id, {} FROM {}").format(col, t))}
    assert now == {i: before[i][position] for i in now}, SEED
    updates = Counter(r[0] for r in pg.admin.execute(sql.SQL("SELECT id FROM {}").format(counted)))
    assert updates == Counter(changed), SEED
    again = tag("backfill_again")
    pg.admin.execute("SELECT etc_batch.register_revert(%s, %s)", (back, again))
    pg.admin.execute("CALL etc_batch.drain_job(%s)", (again,))
    now = {r[0]: r[1] for r in pg.admin.execute(sql.SQL("SELECT id, {} FROM {}").format(col, t))}
    assert now == {i: value[i] if i in changed else before[i][position] for i in now}, SEED


@pytest.mark.parametrize("include_drifted", [False, True])
def test_register_remainder_after_a_conflict(client, include_drifted):
    """A job stopped in conflict by a changed row: register_remainder approves, in one
    call, what it did not change (the drifted row too, at its state now, when asked);
    the job ends continued as the new one, which drains to the end. What it leaves out
    (the drifted row unless asked, a row deleted meanwhile) is named in job_left_out and
    counted in a NOTICE the client receives, so that every approved item is accounted
    for; the drifted one left out is approved later by a call of its own."""
    pg = client.pg
    accounts = Accounts(pg, 100)
    job, rest, later = tag("conflicted"), tag("remainder"), tag("later")
    conn = client.connect()
    notices = []
    conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_detail)))
    assert accounts.register(conn, job, range(1, 101), 10) == (job, True, 100, 10)
    assert conn.execute("CALL etc_batch.drain_job(%s, 3)", (job,)).fetchone()[1] == 30
    pg.admin.execute(sql.SQL("UPDATE {} SET balance = 0 WHERE id = 45").format(accounts.ident))
    with pytest.raises(errors.IntegrityConstraintViolation):
        conn.execute("CALL etc_batch.drain_job(%s)", (job,))
    pg.admin.execute(sql.SQL("DELETE FROM {} WHERE id = 77").format(accounts.ident))
    notices.clear()
    got = conn.execute(
        "SELECT job_id, created, items, chunks FROM etc_batch.register_remainder(%s, %s, "
        "include_drifted => %s)", (job, rest, include_drifted)).fetchone()
    # chunk 4 committed before the drain met the changed row in chunk 5
    expected = 59 if include_drifted else 58
    assert got == (rest, True, expected, 6)
    left_out = {k: (s, a) for k, s, a in pg.admin.execute(
        "SELECT item_key, state, approved_again_as FROM etc_batch.job_left_out WHERE job_id = %s",
        (rest,))}
    assert left_out == ({"77": ("gone", None)} if include_drifted
                        else {"45": ("drifted", None), "77": ("gone", None)})
    told = [n for n in notices if "leaves out" in n[0]]
    assert told == [(f'job "{rest}" leaves out {len(left_out)} item{"s" if len(left_out) > 1 else ""} '
                     f'of job "{job}"',
                     ("Gone: 1." if include_drifted else "Drifted: 1; gone: 1.")
                     + f' "etc_batch.job_left_out" names each of them, with job_id \'{rest}\'.')], notices
    committed = pg.admin.execute("SELECT count(*) FROM etc_batch.job_audit WHERE job_id = %s",
                                 (job,)).fetchone()[0]
    assert committed + expected + len(left_out) == 100
    assert pg.admin.execute(
        "SELECT status, continued_as FROM etc_batch.job_progress WHERE job_id = %s",
        (job,)).fetchone() == ("continued", rest)
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="was continued as another job"):
        conn.execute("CALL etc_batch.drain_job(%s)", (job,))
    assert conn.execute("CALL etc_batch.drain_job(%s)", (rest,)).fetchone()[4] == "done"
    items = [int(k) for (k,) in pg.admin.execute(
        "SELECT item_key FROM etc_batch.job_item WHERE job_id = %s ORDER BY position", (rest,))]
    assert items == [i for i in range(41, 101) if i != 77 and (include_drifted or i != 45)]
    if not include_drifted:
        # the drifted row, approved later at its state now: a job of its own
        assert conn.execute(
            "SELECT items FROM etc_batch.register_remainder(%s, %s, include_drifted => true)",
            (job, later)).fetchone() == (1,)
        assert pg.admin.execute(
            "SELECT approved_again_as FROM etc_batch.job_left_out WHERE job_id = %s AND item_key = '45'",
            (rest,)).fetchone() == (later,)
        assert conn.execute("CALL etc_batch.drain_job(%s)", (later,)).fetchone()[4] == "done"
    rows = accounts.rows()
    assert 77 not in rows and rows[45] == ("standard", 0)
    assert all(rows[i][0] == "standard" for i in range(1, 101) if i != 77)


def test_a_never_analyzed_table_is_not_read_whole_by_a_chunk(pg):
    """Half a million rows loaded into a table autovacuum leaves alone, never analyzed:
    a job of 20,000 integer keys in chunks of 5,000 reads it through its primary key,
    never whole (pg_stat_user_tables counts no row read by a sequential scan), and
    neither once the table is analyzed. The speed, with and without statistics, is
    bench/run's ("chunks without statistics")."""
    name = tag("loaded")
    t = sql.Identifier(name)
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (id int PRIMARY KEY, v int NOT NULL, st text NOT NULL) "
        "WITH (autovacuum_enabled = false)").format(t))
    pg.admin.execute(sql.SQL(
        "INSERT INTO {} SELECT g, g, 'new' FROM generate_series(1, 500000) g").format(t))

    def reltuples():
        return pg.admin.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass",
                                (name,)).fetchone()[0]

    assert reltuples() == -1, "the table was analyzed"
    job = tag("unanalyzed")
    conn = pg.direct()
    conn.execute(
        "SELECT etc_batch.register_job_from_query(%s, NULL, %s::regclass, "
        "format('SELECT id FROM %%I WHERE id %%%% 25 = 0', %s::text), 5000, '{\"st\": \"done\"}', "
        "tenant_column => NULL, revision_column => NULL)", (job, name, name))

    def scans():
        # the drainer's counters, flushed at its next statement; then read afresh
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")
        pg.admin.execute("SELECT pg_stat_clear_snapshot()")
        return pg.admin.execute(
            "SELECT coalesce(seq_tup_read, 0), coalesce(idx_scan, 0) FROM pg_stat_user_tables "
            "WHERE relid = %s::regclass", (name,)).fetchone()

    for analyzed in (False, True):
        if analyzed:
            pg.admin.execute(sql.SQL("ANALYZE {}").format(t))
            assert reltuples() > 0
        seq_before, idx_before = scans()
        row = conn.execute("CALL etc_batch.drain_job(%s, 2)", (job,)).fetchone()
        assert row[:2] == (2, 10000)
        wait_until(lambda: scans()[1] > idx_before, "the drain's statistics to be flushed")
        seq_after, _ = scans()
        assert seq_after == seq_before, (
            f"analyzed={analyzed}: the drain read {seq_after - seq_before} rows sequentially")
    assert row[4] == "done"
    assert pg.admin.execute(sql.SQL("SELECT count(*) FROM {} WHERE st = 'done'").format(t)
                            ).fetchone()[0] == 20000


def test_a_pacing_drainer_is_at_work_and_paused_time_is_not_work(pg):
    """While a drain sleeps between chunks for its pace, job_progress shows its drainer
    (and what it waits for), and the doctor says nothing of a job stopped half-way.
    Paused with nobody draining for a while, then finished: the seconds at work leave
    the pause out, the rate is the items over them, and no finish is estimated while
    the job is paused."""
    accounts = Accounts(pg, 200)
    job = tag("paced")
    conn = pg.direct()
    accounts.register(conn, job, range(1, 201), 10)
    conn.execute("SELECT etc_batch.pace_job(%s, 20)", (job,))  # a chunk every half second
    drainer = pg.direct()
    pid = drainer.info.backend_pid
    result = {}
    thread = threading.Thread(target=lambda: result.update(row=drainer.execute(
        "CALL etc_batch.drain_job(%s, 4)", (job,)).fetchone()), daemon=True)
    started = time.monotonic()
    thread.start()
    wait_until(lambda: "paced" in (pg.admin.execute(
        "SELECT waiting FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()[0] or ""),
        "the drain to sleep for its pace")
    progress = pg.admin.execute(
        "SELECT drainers, drainer_pids, committed FROM etc_batch.job_progress WHERE job_id = %s",
        (job,)).fetchone()
    assert progress[0] == 1 and progress[1] == [pid] and progress[2] > 0, progress
    # nothing wrong: at most the row that says what it waits for, which is no warning
    assert all(status == "ok" and "paced" in detail for status, detail in doctor_rows(pg, job)), \
        doctor_rows(pg, job)
    thread.join(30)
    assert result["row"][:2] == (4, 40)
    worked_before = time.monotonic() - started

    # stopped half-way with nobody draining: now the doctor says so
    assert [s for s, _ in doctor_rows(pg, job)] == ["warn"]
    # paused for three seconds, nobody at work
    conn.execute("SELECT etc_batch.pace_job(%s, NULL)", (job,))
    conn.execute("SELECT etc_batch.pause_job(%s)", (job,))
    assert pg.admin.execute("SELECT estimated_finish FROM etc_batch.job_progress WHERE job_id = %s",
                            (job,)).fetchone()[0] is None
    time.sleep(3)
    conn.execute("SELECT etc_batch.resume_job(%s)", (job,))
    wall_start = pg.admin.execute("SELECT started_at FROM etc_batch.job_progress WHERE job_id = %s",
                                  (job,)).fetchone()[0]
    assert drainer.execute("CALL etc_batch.drain_job(%s, 4)", (job,)).fetchone()[:2] == (4, 40)
    seconds, rate, committed, last, estimated = pg.admin.execute(
        "SELECT seconds_at_work, items_per_second, committed, last_commit_at, estimated_finish "
        "FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()
    wall = (last - wall_start).total_seconds()
    assert committed == 80
    assert wall > 3 + float(seconds), (wall, seconds)  # the pause is not at work
    assert 0 < float(seconds) < worked_before + 1.0, (seconds, worked_before)
    # both are rounded to a tenth
    assert abs(float(rate) * float(seconds) / 80 - 1) < 0.06, (rate, seconds)
    # 120 items to go at that rate, from the last commit
    expected = 120 / (80 / float(seconds))
    assert abs((estimated - last).total_seconds() - expected) < 0.5, (estimated, last, expected)


def test_a_failed_drain_is_recorded_where_a_dba_looks(client):
    """A trigger refuses some rows: the drain fails with the trigger's SQLSTATE, the
    chunk rolled back, the job pending; job_summary, job_progress and the doctor show
    when, with what, in which chunk. The cause removed, the next drain finishes and the
    doctor goes quiet."""
    pg = client.pg
    accounts = Accounts(pg, 40)
    fn = sql.Identifier(tag("refuse"))
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.id = 25 THEN RAISE EXCEPTION 'account % is frozen', NEW.id "
        "USING ERRCODE = 'P0042'; END IF; RETURN NEW; END $$").format(fn))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER frozen BEFORE UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
            accounts.ident, fn))
    job = tag("frozen")
    conn = client.connect()
    accounts.register(conn, job, range(1, 41), 10)
    with pytest.raises(psycopg.Error) as failed:
        conn.execute("CALL etc_batch.drain_job(%s)", (job,))
    assert failed.value.sqlstate == "P0042"
    assert failed.value.diag.message_primary == "account 25 is frozen"
    summary = pg.admin.execute(
        "SELECT status, committed, failure_sqlstate, failure_message, failed_at IS NOT NULL "
        "FROM etc_batch.job_summary(%s)", (job,)).fetchone()
    assert summary == ("pending", 20, "P0042", "account 25 is frozen", True)
    progress = pg.admin.execute(
        "SELECT status, committed, failure_sqlstate, failure_chunk, drainers "
        "FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()
    assert progress == ("pending", 20, "P0042", 3, 0)
    [(status, detail)] = doctor_rows(pg, job)
    assert status == "warn" and "in chunk 3 with P0042: account 25 is frozen" in detail, detail
    assert {r[0] for r in accounts.rows().values()} == {"standard", "basic"}
    assert sum(1 for plan, _ in accounts.rows().values() if plan == "standard") == 20

    pg.admin.execute(sql.SQL("DROP TRIGGER frozen ON {}").format(accounts.ident))
    assert conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4] == "done"
    assert doctor_rows(pg, job) == []
    assert all(plan == "standard" for plan, _ in accounts.rows().values())


def test_a_revert_drained_while_the_application_works_and_drainers_are_killed(pg):
    """orders: 3,000 rows with a revision column; a job cancels the 2,000 whose id is not
    a multiple of 3, expecting them pending, and is drained. The application then changes
    30 of them (their revision moves on), and keeps updating the other 1,000 rows all the
    time. The revert, parallel, is drained by three clients whose backends are killed at
    random moments, mostly inside a chunk: in the end each of the 1,970 rows it approved
    was set back from cancelled to pending exactly once (a trigger records every update
    that committed), the 30 are named as drifted and keep what the application wrote, and
    no other row was touched by it."""
    rng = random.Random(SEED)
    name = tag("orders")
    t = sql.Identifier(name)
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'pending', "
        "revision bigint NOT NULL DEFAULT 1, note text)").format(t))
    pg.admin.execute(sql.SQL("INSERT INTO {} (id) SELECT g FROM generate_series(1, 3000) g").format(t))
    job, revert = tag("cancel"), tag("uncancel")
    row = pg.admin.execute(
        "SELECT items FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, "
        "format('SELECT id, revision FROM %%I WHERE id %%%% 3 <> 0', %s::text), 100, "
        "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}', tenant_column => NULL)",
        (job, name, name)).fetchone()
    assert row == (2000,)
    assert pg.admin.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4] == "done"

    # from here on, every update that commits is recorded, with the status it replaced
    log = record_status_changes(pg, name)
    # each chunk's statement of the revert lingers before its commit, where most kills land
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF EXISTS (SELECT FROM new_rows WHERE status = 'pending' AND note IS NULL) THEN "
        "PERFORM pg_sleep(0.05); END IF; RETURN NULL; END $$").format(fn=sql.Identifier(f"{name}_linger")))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER linger AFTER UPDATE ON {} REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION {}()").format(t, sql.Identifier(f"{name}_linger")))

    drifted = sorted(rng.sample([i for i in range(1, 3001) if i % 3 != 0], 30))
    pg.admin.execute(sql.SQL(
        "UPDATE {} SET note = 'kept by the application', revision = revision + 1 "
        "WHERE id = ANY(%s)").format(t), (drifted,))
    preview = pg.admin.execute(
        "SELECT items, drifted, gone FROM etc_batch.revert_preview(%s)", (job,)).fetchone()
    assert preview == (1970, 30, 0)
    pg.admin.execute("SELECT etc_batch.register_revert(%s, %s, chunk_size => 25, parallel => true)",
                     (job, revert))
    named = [int(k) for (k,) in pg.admin.execute(
        "SELECT item_key FROM etc_batch.job_left_out WHERE job_id = %s AND state = 'drifted' "
        "ORDER BY position", (revert,))]
    assert named == drifted

    others = [i for i in range(1, 3001) if i % 3 == 0]
    working = threading.Event()
    working.set()

    def application():
        conn = pg.direct()
        app_rng = random.Random(SEED + 1)
        while working.is_set():
            ids = sorted(app_rng.sample(others, 5))
            conn.execute(sql.SQL(
                "UPDATE {} SET note = 'busy', revision = revision + 1 WHERE id = ANY(%s)").format(t), (ids,))
            time.sleep(0.01)

    app = threading.Thread(target=application, daemon=True)
    app.start()
    try:
        drain_while_killed(pg, revert, rng, pause=(0.05, 0.3))
    finally:
        working.clear()
        app.join(60)
    assert not app.is_alive()
    assert pg.admin.execute("SELECT status FROM etc_batch.job WHERE job_id = %s",
                            (revert,)).fetchone()[0] == "done"

    set_back = Counter(i for (i,) in pg.admin.execute(sql.SQL(
        "SELECT id FROM {} WHERE was = 'cancelled' AND became = 'pending'").format(log)))
    approved = {i for i in range(1, 3001) if i % 3 != 0} - set(drifted)
    assert set_back == Counter({i: 1 for i in approved}), SEED
    now = {i: (s, n) for i, s, n in pg.admin.execute(sql.SQL("SELECT id, status, note FROM {}").format(t))}
    assert {i: now[i] for i in drifted} == {i: ("cancelled", "kept by the application") for i in drifted}
    assert {now[i] for i in approved} == {("pending", None)}
    assert {now[i][0] for i in others} == {"pending"}
    counts, _ = audit_counts(pg, revert)
    assert len(counts) == 1970 and set(counts.values()) == {1}
    checks = pg.admin.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (revert,)).fetchall()
    assert checks and all(ok for _, ok in checks), checks
    assert pg.admin.execute("SELECT status FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()[0] == "reverted"


@pytest.mark.parametrize("parallel", [False, True])
def test_a_job_reverted_while_its_drainers_are_in_a_chunk(pg, parallel):
    """Two clients drain a job whose every chunk lingers 0.3 s before its commit; a third
    registers its revert while they are inside chunks. The revert waits for the chunks in
    flight to commit (it is registered after them, not beside them), the job ends
    reverted, each drainer's next call fails with 55000 naming the revert, and nothing
    of the job changes after: the revert sets back exactly the items the job committed,
    each once."""
    name = tag("orders")
    t = sql.Identifier(name)
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'pending', "
        "revision bigint NOT NULL DEFAULT 1)").format(t))
    pg.admin.execute(sql.SQL("INSERT INTO {} (id) SELECT g FROM generate_series(1, 400) g").format(t))
    log = record_status_changes(pg, name)
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM pg_sleep(0.3); RETURN NULL; END $$").format(fn=sql.Identifier(f"{name}_linger")))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER linger AFTER UPDATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}()").format(
            t, sql.Identifier(f"{name}_linger")))
    job, revert = tag("cancel"), tag("uncancel")
    pg.admin.execute(
        "SELECT etc_batch.register_job_from_query(%s, NULL, %s::regclass, "
        "format('SELECT id, revision FROM %%I', %s::text), 10, "
        "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}', tenant_column => NULL, "
        "parallel => %s)", (job, name, name, parallel))

    drainers = 2 if parallel else 1
    ended, started = [], threading.Barrier(drainers + 1)

    def drainer():
        conn = pg.direct()
        started.wait()
        try:
            while True:
                conn.execute("CALL etc_batch.drain_job(%s, 1)", (job,))
        except psycopg.Error as e:
            ended.append(e)

    threads = [threading.Thread(target=drainer, daemon=True) for _ in range(drainers)]
    for th in threads:
        th.start()
    started.wait()
    # the drainers are inside a chunk: an update of the target waits to commit
    wait_until(lambda: pg.admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event = 'PgSleep'").fetchone()[0] >= drainers, "the drainers inside a chunk")
    time.sleep(0.5)
    row = pg.admin.execute("SELECT items FROM etc_batch.register_revert(%s, %s)", (job, revert)).fetchone()
    for th in threads:
        th.join(30)
        assert not th.is_alive()
    assert [e.sqlstate for e in ended] == ["55000"] * drainers, ended
    assert all(f'job "{job}" was reverted' in str(e) for e in ended), ended
    committed = pg.admin.execute(
        "SELECT count(*) FROM etc_batch.job_audit WHERE job_id = %s", (job,)).fetchone()[0]
    assert row[0] == committed > 0
    assert pg.admin.execute("SELECT status, reverted_by FROM etc_batch.job WHERE job_id = %s",
                            (job,)).fetchone() == ("reverted", revert)
    pg.admin.execute(sql.SQL("DROP TRIGGER linger ON {}").format(t))
    assert pg.admin.execute("CALL etc_batch.drain_job(%s)", (revert,)).fetchone()[4] == "done"
    changes = Counter(pg.admin.execute(sql.SQL("SELECT was, became FROM {}").format(log)).fetchall())
    assert changes == {("pending", "cancelled"): committed, ("cancelled", "pending"): committed}
    assert pg.admin.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'pending' AND revision IN (1, 3)")
                            .format(t)).fetchone()[0] == 400
