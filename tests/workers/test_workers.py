"""Launches on a real cluster with etc_batch preloaded: the work finishes exactly once
with no client session held, through everything that ends a worker process.

- a 4-worker launch of a parallel job whose client disconnects at once;
- workers terminated at random (pg_terminate_backend) until the job is done: the
  supervisor starts them again; the same for a job that moves its rows to an archive,
  and for one that sets them from a join (set_from_query);
- a worker SIGKILLed, which makes the postmaster restart every backend: after crash
  recovery the launcher and the supervisor resume the launch;
- pg_ctl restart -m immediate while a job drains and while a chain runs;
- a failover to a promoted streaming standby, the launch finishing there, every chunk
  that was committed (and so on the synchronous standby) there exactly once;
- max_worker_processes exhausted, and etc_batch.max_workers reached: 53400, nothing
  launched;
- a launched chain whose step commits (a drain) and whose other step commits too but
  was added by another role, run by a worker connected as that role;
- what a worker's NOTICEs become: log lines, at the launching session's level.

Every item changed exactly once is checked by the audit (one row per item) and by a
trigger that counts the updates that committed; ETC_BATCH_WORKERS_SEED repeats the
random choices of a run.
"""

import os
import random
import secrets
import signal
import time
from collections import Counter

import psycopg
import pytest
from psycopg import errors, sql

SEED = int(os.environ.get("ETC_BATCH_WORKERS_SEED", secrets.randbits(32)))


def tag(label):
    return f"{label}_{secrets.token_hex(3)}"


class Orders:
    """orders_<tag>(id, status) with a trigger counting each committed update per id in
    orders_<tag>_updates, with the backend that made it and when, and one that makes
    each chunk's statement linger `linger` seconds (so that a drain lasts long enough for
    things to happen to it)."""

    def __init__(self, conn, n, linger=0.05):
        self.name = tag("orders")
        self.t = sql.Identifier(self.name)
        self.counted = sql.Identifier(f"{self.name}_updates")
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, status text NOT NULL DEFAULT 'new')")
                     .format(self.t))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g FROM generate_series(1, %s) g").format(self.t), (n,))
        # written by the chunk's own transaction: a row here is a chunk that committed,
        # in the backend that ran it, at a time before its commit
        conn.execute(sql.SQL("CREATE TABLE {} (id int, pid int NOT NULL DEFAULT pg_backend_pid(), "
                             "at timestamptz NOT NULL DEFAULT clock_timestamp())").format(self.counted))
        count = sql.Identifier(f"{self.name}_count")
        conn.execute(sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                             "$$ BEGIN INSERT INTO {} (id) VALUES (NEW.id); RETURN NEW; END $$")
                     .format(count, self.counted))
        conn.execute(sql.SQL("CREATE TRIGGER counted AFTER UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION {}()")
                     .format(self.t, count))
        if linger:
            slow = sql.Identifier(f"{self.name}_linger")
            conn.execute(sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                                 "$$ BEGIN PERFORM pg_sleep({}); RETURN NULL; END $$")
                         .format(slow, sql.Literal(linger)))
            conn.execute(sql.SQL("CREATE TRIGGER linger AFTER UPDATE ON {} FOR EACH STATEMENT "
                                 "EXECUTE FUNCTION {}()").format(self.t, slow))

    def register(self, conn, job, chunk, parallel=True, ids=None):
        where = "" if ids is None else f" WHERE id <= {ids}"
        return conn.execute(
            "SELECT items FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, %s, %s, "
            "'{\"status\": \"done\"}', tenant_column => NULL, revision_column => NULL, parallel => %s)",
            (job, self.name, f"SELECT id FROM public.{self.name}{where}", chunk, parallel)).fetchone()[0]

    def updates(self, conn):
        return dict(conn.execute(sql.SQL("SELECT id, count(*) FROM {} GROUP BY id").format(self.counted)))

    def changed_by(self, conn):
        """{backend pid: rows it changed in chunks that committed}."""
        return dict(conn.execute(sql.SQL("SELECT pid, count(*) FROM {} GROUP BY pid").format(self.counted)))

    def changed_around(self, conn, moment):
        """(rows changed before `moment`, rows changed after it), by chunks that committed."""
        return conn.execute(sql.SQL("SELECT count(*) FILTER (WHERE at < %s), count(*) FILTER (WHERE at > %s) "
                                    "FROM {}").format(self.counted), (moment, moment)).fetchone()


def launch(conn, job, workers=1):
    return conn.execute("SELECT launch_id, pids FROM etc_batch.launch_job(%s, %s)", (job, workers)).fetchone()


def wait_launch(cluster, launch_id, timeout=180):
    """Waits for the launch to end and its runs too; returns its status."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with cluster.connect() as conn:
                row = conn.execute(
                    "SELECT l.status, EXISTS (SELECT FROM etc_batch.launch_run r WHERE r.launch_id = l.launch_id "
                    "AND r.ended_at IS NULL AND r.pid IN (SELECT pid FROM pg_stat_activity)) "
                    "FROM etc_batch.launch l WHERE l.launch_id = %s", (launch_id,)).fetchone()
                if row[0] != "running" and not row[1]:
                    return row[0]
        except psycopg.OperationalError:
            pass  # the server is restarting
        assert time.monotonic() < deadline, f"launch {launch_id} did not end (seed {SEED})"
        time.sleep(0.2)


def exactly_once(conn, orders, job, n):
    assert orders.updates(conn) == {i: 1 for i in range(1, n + 1)}, SEED
    audits = conn.execute("SELECT count(*), count(DISTINCT position) FROM etc_batch.job_audit "
                          "WHERE job_id = %s", (job,)).fetchone()
    assert audits == (n, n)
    checks = conn.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert checks and all(ok for _, ok in checks), checks


def worker_pids(conn, launch_id):
    return [r[0] for r in conn.execute(
        "SELECT r.pid FROM etc_batch.launch_run r JOIN pg_stat_activity a ON a.pid = r.pid "
        "WHERE r.launch_id = %s AND r.ended_at IS NULL AND a.backend_type = 'etc_batch worker'",
        (launch_id,))]


def terminate_until_ended(conn, launch_id, rng):
    """Terminates one of the launch's workers at random every few tenths of a second
    while the launch runs; returns how many terminations landed."""
    kills = 0
    deadline = time.monotonic() + 240
    while conn.execute("SELECT status FROM etc_batch.launch WHERE launch_id = %s",
                       (launch_id,)).fetchone()[0] == "running":
        assert time.monotonic() < deadline, f"the launch did not finish (seed {SEED})"
        time.sleep(rng.uniform(0.2, 0.6))
        pids = worker_pids(conn, launch_id)
        if pids and conn.execute("SELECT pg_terminate_backend(%s)", (rng.choice(pids),)).fetchone()[0]:
            kills += 1
    return kills


def test_a_launch_finishes_with_its_client_gone(workers):
    """Four workers drain a parallel job while nobody is connected: the launching
    client disconnects as soon as launch_job returns."""
    with workers.connect() as conn:
        orders = Orders(conn, 4000)
        job = tag("gone")
        assert orders.register(conn, job, 100) == 4000
        launch_id, pids = launch(conn, job, 4)
        assert len(pids) == 4 and all(p > 0 for p in pids)
    # nobody is connected now
    assert wait_launch(workers, launch_id) == "done"
    with workers.connect() as conn:
        exactly_once(conn, orders, job, 4000)
        runs = conn.execute("SELECT worker, run, role, started_by, outcome FROM etc_batch.launches "
                            "WHERE launch_id = %s ORDER BY worker", (launch_id,)).fetchall()
        assert [(w, r, s) for w, r, _, s, _ in runs] == [(w, 1, "launch") for w in (1, 2, 3, 4)]
        assert {o for *_, o in runs} <= {"done", "pending"} and "done" in {o for *_, o in runs}
        # four workers took part: the backend of each of the launch's four runs changed
        # rows in chunks that committed, and no other backend did
        run_pids = {r[0] for r in conn.execute("SELECT pid FROM etc_batch.launch_run WHERE launch_id = %s",
                                               (launch_id,))}
        assert run_pids == set(pids), (run_pids, pids)
        changed_by = orders.changed_by(conn)
        assert set(changed_by) == run_pids, (changed_by, run_pids)


def test_workers_terminated_at_random_until_done(workers):
    """pg_terminate_backend of workers, one at random every few tenths of a second, until
    the job is done: each is started again by the database's supervisor, and the job
    finishes with every item changed once."""
    rng = random.Random(SEED)
    with workers.connect() as conn:
        orders = Orders(conn, 3000, linger=0.08)
        job = tag("killed")
        orders.register(conn, job, 50)
        launch_id, _ = launch(conn, job, 3)
        kills = terminate_until_ended(conn, launch_id, rng)
    assert wait_launch(workers, launch_id) == "done"
    assert kills >= 3, f"too few kills to prove anything: {kills} (seed {SEED})"
    with workers.connect() as conn:
        exactly_once(conn, orders, job, 3000)
        outcomes = Counter(r[0] for r in conn.execute(
            "SELECT outcome FROM etc_batch.launch_run WHERE launch_id = %s", (launch_id,)))
        assert outcomes["interrupted"] >= 1, outcomes
        restarted = conn.execute("SELECT count(*) FROM etc_batch.launch_run WHERE launch_id = %s "
                                 "AND started_by = 'resume'", (launch_id,)).fetchone()[0]
        assert restarted >= 1
    print(f"{kills} workers terminated (seed {SEED})")


def counted_and_lingering(conn, name, event, counted):
    """Each row of table `name` that an `event` (UPDATE, DELETE) which commits changes is
    counted in table `counted` (id), made here; and each such statement lingers before
    its commit, where most terminations land."""
    conn.execute(sql.SQL("CREATE TABLE {} (id int)").format(counted))
    count, slow = sql.Identifier(f"{name}_count"), sql.Identifier(f"{name}_linger")
    row = "OLD" if event == "DELETE" else "NEW"
    conn.execute(sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                         "$$ BEGIN INSERT INTO {} VALUES ({}.id); RETURN NULL; END $$")
                 .format(count, counted, sql.SQL(row)))
    conn.execute(sql.SQL("CREATE TRIGGER counted AFTER {} ON {} FOR EACH ROW EXECUTE FUNCTION {}()")
                 .format(sql.SQL(event), sql.Identifier(name), count))
    conn.execute(sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                         "$$ BEGIN PERFORM pg_sleep(0.08); RETURN NULL; END $$").format(slow))
    conn.execute(sql.SQL("CREATE TRIGGER linger AFTER {} ON {} FOR EACH STATEMENT "
                         "EXECUTE FUNCTION {}()").format(sql.SQL(event), sql.Identifier(name), slow))


def test_a_backfill_from_a_join_launched_and_its_workers_terminated_at_random(workers):
    """A parallel job that sets 3,000 rows' region to their customer's (set_from_query,
    the items query joins), launched with three workers terminated at random until it is
    done: every row updated exactly once (a trigger counts the updates that committed)
    to its customer's region, and its value before recorded with its item."""
    rng = random.Random(SEED)
    with workers.connect() as conn:
        name = tag("accounts")
        t, customers = sql.Identifier(name), sql.Identifier(f"{name}_customers")
        updates = sql.Identifier(f"{name}_updates")
        conn.execute(sql.SQL("CREATE TABLE {} (customer_id int PRIMARY KEY, region text NOT NULL)")
                     .format(customers))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g, 'r' || (g % 5) FROM generate_series(0, 99) g")
                     .format(customers))
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, customer_id int NOT NULL, region text)")
                     .format(t))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g, g % 100 FROM generate_series(1, 3000) g").format(t))
        counted_and_lingering(conn, name, "UPDATE", updates)
        job = tag("joined")
        assert conn.execute(
            "SELECT items FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, %s, 50, NULL, "
            "tenant_column => NULL, revision_column => NULL, parallel => true, "
            "set_from_query => '{region}')",
            (job, name, f"SELECT a.id, c.region FROM public.{name} a "
                        f"JOIN public.{name}_customers c USING (customer_id)")).fetchone()[0] == 3000
        launch_id, _ = launch(conn, job, 3)
        kills = terminate_until_ended(conn, launch_id, rng)
    assert wait_launch(workers, launch_id) == "done"
    assert kills >= 3, f"too few kills to prove anything: {kills} (seed {SEED})"
    with workers.connect() as conn:
        counted = dict(conn.execute(sql.SQL("SELECT id, count(*) FROM {} GROUP BY id").format(updates)))
        assert counted == {i: 1 for i in range(1, 3001)}, SEED
        wrong = conn.execute(sql.SQL(
            "SELECT count(*) FROM {} a JOIN {} c USING (customer_id) "
            "WHERE a.region IS DISTINCT FROM c.region").format(t, customers)).fetchone()[0]
        assert wrong == 0
        recorded = conn.execute(
            "SELECT count(*) FILTER (WHERE guards -> '' = '{\"region\": null}') FROM etc_batch.job_item "
            "WHERE job_id = %s", (job,)).fetchone()[0]
        assert recorded == 3000
        checks = conn.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
        assert checks and all(ok for _, ok in checks), checks
    print(f"{kills} workers terminated (seed {SEED})")


def test_a_move_to_an_archive_launched_and_its_workers_terminated_at_random(workers):
    """A parallel job that moves 3,000 rows to an archive table (action move), launched
    with three workers terminated at random until it is done: every row is in the
    archive exactly once and gone from the table, each deleted once (a trigger counts
    the deletes that committed), each kept whole with the audit."""
    rng = random.Random(SEED)
    with workers.connect() as conn:
        name = tag("ledger")
        t, archive = sql.Identifier(name), sql.Identifier(f"{name}_archive")
        deletes = sql.Identifier(f"{name}_deletes")
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, amount numeric NOT NULL)").format(t))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g, g * 1.5 FROM generate_series(1, 3000) g").format(t))
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {})").format(archive, t))
        counted_and_lingering(conn, name, "DELETE", deletes)
        job = tag("moved")
        assert conn.execute(
            "SELECT items FROM etc_batch.register_job_from_query(%s, NULL, %s::regclass, %s, 50, NULL, "
            "tenant_column => NULL, revision_column => NULL, parallel => true, action => 'move', "
            "archive => %s::regclass)",
            (job, name, f"SELECT id FROM public.{name}", f"{name}_archive")).fetchone()[0] == 3000
        launch_id, _ = launch(conn, job, 3)
        kills = terminate_until_ended(conn, launch_id, rng)
    assert wait_launch(workers, launch_id) == "done"
    assert kills >= 3, f"too few kills to prove anything: {kills} (seed {SEED})"
    with workers.connect() as conn:
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(t)).fetchone()[0] == 0
        moved = dict(conn.execute(sql.SQL("SELECT id, count(*) FROM {} GROUP BY id").format(archive)))
        assert moved == {i: 1 for i in range(1, 3001)}, SEED
        deleted = dict(conn.execute(sql.SQL("SELECT id, count(*) FROM {} GROUP BY id").format(deletes)))
        assert deleted == {i: 1 for i in range(1, 3001)}, SEED
        kept = conn.execute(sql.SQL(
            "SELECT count(*), count(*) FILTER (WHERE (k::{t}).amount = (k::{t}).id * 1.5) "
            "FROM etc_batch.job_audit_chunk a, unnest(a.kept) k WHERE a.job_id = %s").format(t=t),
            (job,)).fetchone()
        assert kept == (3000, 3000)
        checks = conn.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (job,)).fetchall()
        assert checks and all(ok for _, ok in checks), checks
    print(f"{kills} workers terminated (seed {SEED})")


def test_a_worker_killed_hard_and_the_server_recovering(workers):
    """A worker SIGKILLed: the postmaster ends every backend and runs crash recovery;
    the launcher, preloaded, starts the database's supervisor, which starts the launch's
    workers again, and the job finishes, each item once."""
    with workers.connect() as conn:
        orders = Orders(conn, 2000, linger=0.1)
        job = tag("sigkill")
        orders.register(conn, job, 50)
        launch_id, _ = launch(conn, job, 2)
        deadline = time.monotonic() + 30
        while conn.execute("SELECT committed FROM etc_batch.job_progress WHERE job_id = %s",
                           (job,)).fetchone()[0] < 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        victim = worker_pids(conn, launch_id)[0]
    recoveries = workers.server_log().count("database system was interrupted")
    os.kill(victim, signal.SIGKILL)
    workers.wait_connectable()
    assert wait_launch(workers, launch_id) == "done"
    log = workers.server_log()
    assert "terminated by signal 9" in log
    assert log.count("all server processes terminated; reinitializing") >= 1
    # the kill made one crash recovery, and the resumed workers none more
    assert log.count("database system was interrupted") == recoveries + 1, log[-3000:]
    with workers.connect() as conn:
        exactly_once(conn, orders, job, 2000)
        assert conn.execute("SELECT count(*) FROM etc_batch.launch_run WHERE launch_id = %s "
                            "AND outcome = 'interrupted'", (launch_id,)).fetchone()[0] >= 1


def test_an_immediate_restart_mid_drain_and_mid_chain(workers):
    """pg_ctl restart -m immediate while a job drains and a chain runs: after crash
    recovery both finish by themselves, each item changed once and each step run once.
    Each was caught in the middle: some of its work committed before the restart and
    the rest after it, by a run of its launch started again."""
    with workers.connect() as conn:
        orders = Orders(conn, 2000, linger=0.1)
        job = tag("restart")
        orders.register(conn, job, 50)
        batch = tag("nightly")
        conn.execute("CREATE TABLE IF NOT EXISTS chain_ran (batch text, step int, "
                     "at timestamptz NOT NULL DEFAULT clock_timestamp())")
        first = None
        # five steps of a second each: the restart comes after the first, well before the last
        for step in range(1, 6):
            sid = conn.execute(
                "SELECT etc_batch.add_step(%s, %s)",
                (batch, f"INSERT INTO chain_ran (batch, step) VALUES ('{batch}', {step}); "
                        "SELECT pg_sleep(1)")).fetchone()[0]
            first = first or sid
        drain_launch, _ = launch(conn, job, 2)
        chain_launch = conn.execute("SELECT launch_id FROM etc_batch.launch_batch(%s)", (first,)).fetchone()[0]
        deadline = time.monotonic() + 30
        while (conn.execute("SELECT committed FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()[0] < 200
               or conn.execute("SELECT count(*) FROM chain_ran WHERE batch = %s", (batch,)).fetchone()[0] < 1):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    workers.restart_immediately()
    workers.wait_connectable()
    assert wait_launch(workers, drain_launch) == "done"
    assert wait_launch(workers, chain_launch) == "done"
    with workers.connect() as conn:
        exactly_once(conn, orders, job, 2000)
        ran = Counter(r[0] for r in conn.execute("SELECT step FROM chain_ran WHERE batch = %s", (batch,)))
        assert ran == Counter({s: 1 for s in range(1, 6)}), ran
        # the restart: the postmaster that runs now started then
        restarted_at = conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
        before, after = orders.changed_around(conn, restarted_at)
        assert before > 0 and after > 0 and before + after == 2000, (before, after)
        steps_before = conn.execute("SELECT count(*) FROM chain_ran WHERE batch = %s AND at < %s",
                                    (batch, restarted_at)).fetchone()[0]
        assert 0 < steps_before < 5, steps_before
        # each launch went on in a run started again after the restart
        for launch_id in (drain_launch, chain_launch):
            resumed = conn.execute(
                "SELECT count(*) FROM etc_batch.launch_run WHERE launch_id = %s AND started_by = 'resume' "
                "AND started_at > %s", (launch_id, restarted_at)).fetchone()[0]
            assert resumed >= 1, (launch_id, resumed)


def test_worker_slots_exhausted_launch_nothing(workers):
    """More workers than max_worker_processes has free slots: 53400, and no launch, no
    worker left; more than etc_batch.max_workers: 53400 before any starts."""
    with workers.connect() as conn:
        orders = Orders(conn, 100, linger=0)
        job = tag("slots")
        orders.register(conn, job, 10)
        conn.execute("ALTER SYSTEM SET etc_batch.max_workers = 100")
        conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        try:
            with pytest.raises(errors.ConfigurationLimitExceeded) as refused:
                launch(conn, job, 40)
            assert refused.value.diag.message_primary == "no background worker slot is free for the launch"
            assert "max_worker_processes is 16" in refused.value.diag.message_detail
            assert conn.execute("SELECT count(*) FROM etc_batch.launch WHERE job_id = %s",
                                (job,)).fetchone()[0] == 0
            deadline = time.monotonic() + 10
            while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'etc_batch worker'"
                               ).fetchone()[0]:
                assert time.monotonic() < deadline, "workers of a launch that failed stayed"
                time.sleep(0.1)
            assert conn.execute("SELECT committed FROM etc_batch.job_progress WHERE job_id = %s",
                                (job,)).fetchone()[0] == 0
        finally:
            conn.execute("ALTER SYSTEM RESET etc_batch.max_workers")
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        with pytest.raises(errors.ConfigurationLimitExceeded) as refused:
            launch(conn, job, 13)
        assert refused.value.diag.message_primary == "a launch of 13 workers would exceed etc_batch.max_workers"


def test_a_role_that_cannot_log_in_launches_nothing_on_15(workers):
    """On PostgreSQL 15 and 16 a background worker connects only as a role that can log
    in: a launch by a NOLOGIN role is refused (28000) with the ALTER ROLE that allows it,
    before anything starts; with LOGIN, the same launch runs as that role."""
    role = tag("Nologin")
    with workers.connect() as conn:
        orders = Orders(conn, 50, linger=0)
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        try:
            conn.execute(sql.SQL(
                "GRANT USAGE ON SCHEMA etc_batch TO {r}; "
                "GRANT EXECUTE ON FUNCTION etc_batch.launch_job(text, integer) TO {r}; "
                "GRANT EXECUTE ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, "
                "jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO {r}; "
                "GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer, "
                "bigint, text, text, text) TO {r}; GRANT SELECT, UPDATE ON {t} TO {r}; "
                "GRANT INSERT ON {c} TO {r}").format(r=sql.Identifier(role), t=orders.t, c=orders.counted))
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            job = tag("nologin")
            orders.register(conn, job, 10)
            with pytest.raises(errors.InvalidAuthorizationSpecification) as refused:
                launch(conn, job, 1)
            diag = refused.value.diag
            assert diag.sqlstate == "28000"
            assert diag.message_primary == (f'role "{role}" cannot log in, and a launch\'s workers connect '
                                            "as the role that launches them")
            assert diag.message_hint == f'ALTER ROLE "{role}" LOGIN, or launch as a role that may log in.'
            assert conn.execute("SELECT count(*) FROM etc_batch.launches WHERE job_id = %s",
                                (job,)).fetchone()[0] == 0
            conn.execute("RESET ROLE")
            conn.execute(diag.message_hint.split(",")[0])
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            launch_id = launch(conn, job, 1)[0]
            conn.execute("RESET ROLE")
            assert wait_launch(workers, launch_id) == "done"
            assert conn.execute("SELECT DISTINCT role::oid = to_regrole(quote_ident(%s))::oid "
                                "FROM etc_batch.launches WHERE launch_id = %s",
                                (role, launch_id)).fetchall() == [(True,)]
            assert orders.updates(conn) == {i: 1 for i in range(1, 51)}
        finally:
            conn.execute("RESET ROLE")
            conn.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(role)))


def test_a_launched_chain_with_steps_that_commit(workers):
    """A chain launched by its author: a step that CALLs drain_job (it commits) runs in
    the worker's own transactions; another step that commits, added by a second role,
    runs in a worker connected as that role, which the first worker waits for."""
    with workers.connect() as conn:
        orders = Orders(conn, 500, linger=0)
        job = tag("stepjob")
        orders.register(conn, job, 100, parallel=False)
        other = tag("author")
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(other)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(sql.Identifier(other)))
        conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, "
                             "interval, integer) TO {}").format(sql.Identifier(other)))
        conn.execute("CREATE TABLE IF NOT EXISTS committed_by (who text, at int)")
        conn.execute(sql.SQL("GRANT INSERT ON committed_by TO {}").format(sql.Identifier(other)))
        proc = sql.Identifier(tag("twice"))
        conn.execute(sql.SQL(
            "CREATE PROCEDURE {}() LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO committed_by VALUES (current_user, 1); COMMIT; "
            "INSERT INTO committed_by VALUES (current_user, 2); COMMIT; END $$").format(proc))
        conn.execute(sql.SQL("GRANT EXECUTE ON PROCEDURE {}() TO {}").format(proc, sql.Identifier(other)))
        batch = tag("etl")
        first = conn.execute("SELECT etc_batch.add_step(%s, %s, commits => true)",
                             (batch, f"CALL etc_batch.drain_job('{job}')")).fetchone()[0]
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(other)))
        conn.execute("SELECT etc_batch.add_step(%s, %s, commits => true)",
                     (batch, sql.SQL("CALL {}()").format(proc).as_string(conn)))
        conn.execute("RESET ROLE")
        launch_id = conn.execute("SELECT launch_id FROM etc_batch.launch_batch(%s)", (first,)).fetchone()[0]
    assert wait_launch(workers, launch_id) == "done"
    with workers.connect() as conn:
        exactly_once(conn, orders, job, 500)
        assert sorted(conn.execute("SELECT who, at FROM committed_by").fetchall()) == [(other, 1), (other, 2)]
        assert {r[0] for r in conn.execute("SELECT status FROM etc_batch.batch_log WHERE batch = %s",
                                           (batch,))} == {"done"}
        assert [tuple(r) for r in conn.execute(
            "SELECT run_by::text = ran_as::text, outcome FROM etc_batch.step_audit WHERE batch = %s "
            "ORDER BY audit_id", (batch,))] == [(True, "done"), (True, "done")]


def test_a_workers_notices_reach_the_server_log_as_the_client_would_have_seen_them(workers):
    """A worker has no client: a launch made with client_min_messages = notice has its
    chunks' NOTICEs in the server log (whose log_min_messages is warning here); one made
    with warning has none."""
    with workers.connect() as conn:
        orders = Orders(conn, 100, linger=0)
        loud, quiet = tag("loud"), tag("quiet")
        conn.execute("SET client_min_messages = notice")
        orders.register(conn, loud, 50)
        loud_launch, _ = launch(conn, loud)
        assert wait_launch(workers, loud_launch) == "done"
        conn.execute(sql.SQL("UPDATE {} SET status = 'new'").format(orders.t))
        conn.execute("SET client_min_messages = warning")
        orders.register(conn, quiet, 25)
        quiet_launch, _ = launch(conn, quiet)
        assert wait_launch(workers, quiet_launch) == "done"
    log = workers.server_log()
    assert "NOTICE:  chunk 2 of 2 committed: 50 items, keys 51 to 100" in log
    assert "chunk 4 of 4 committed: 25 items" not in log


def test_a_failover_to_a_promoted_standby(workers, standby):
    """The primary commits synchronously to its standby. A launch drains a job; the
    primary is stopped at once and the standby promoted: its launcher resumes the launch
    there, and the job finishes, every chunk a client had seen committed there once."""
    with workers.connect() as conn:
        orders = Orders(conn, 2000, linger=0.1)
        job = tag("failover")
        orders.register(conn, job, 50)
        launch_id, _ = launch(conn, job, 2)
        deadline = time.monotonic() + 30
        while (seen := conn.execute("SELECT committed FROM etc_batch.job_progress WHERE job_id = %s",
                                    (job,)).fetchone()[0]) < 300:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    workers.pg_ctl("-m", "immediate", "-w", "stop")
    standby.pg_ctl("-w", "promote")
    standby.wait_connectable()
    assert wait_launch(standby, launch_id) == "done"
    with standby.connect() as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
        exactly_once(conn, orders, job, 2000)
        assert conn.execute("SELECT committed FROM etc_batch.job_progress WHERE job_id = %s",
                            (job,)).fetchone()[0] == 2000 >= seen
        assert conn.execute("SELECT count(*) FROM etc_batch.launch_run WHERE launch_id = %s "
                            "AND started_by = 'resume'", (launch_id,)).fetchone()[0] >= 1
    # the old primary stays down: the standby is the primary now, and nothing runs after


