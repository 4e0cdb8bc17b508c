"""etc_batch run by real pg_cron schedules.

pg_cron fires at minute boundaries, so the module prepares every case first, schedules
all of its cron jobs in one transaction to fire in the same minute, waits (bounded)
until every one of them has a finished row in cron.job_run_details, unschedules them
all so that nothing fires again, waits until no run is left in flight, and only then
do the tests assert, each on its own case:

  festival     CALL etc_batch.drain_job('festival', 5) on 30 items in chunks of 10
  twice        the same drain_job string scheduled by two cron jobs: overlapping runs
  chain        CALL etc_batch.exec_batch_from_id(first) on 5 steps, scheduled twice
  fails        a chain whose step 2 divides by zero
  clash        a job with a row changed after its approval
  multi        'SET statement_timeout = ...; CALL etc_batch.drain_job(...)': pg_cron
               sends it as one simple query, which PostgreSQL runs as one implicit
               transaction, where drain_job cannot commit
  resume       SELECT etc_batch.resume_launches() on a launch whose worker and
               supervisor ended as a restart ends them (etc_batch is not preloaded
               here): the schedule that resumes launches without preloading
  nightly      CALL etc_batch.run_chain('nightly', '2026-12-01'), the nightly line,
               fired by two schedules in the same minute: one run, each step once
  nights       three nights of chain 'nights', the run keys given (the test does not
               wait for midnight): night 1 done and night 2 failed before the minute
               (by the same calls); in the minute, night 2's line again (its failure
               held: nothing runs again) and night 3's (it waits its turn); after it,
               night 2's step retried and the lines run again: both finish
  how-to       docs/how-to/nightly-chain.md as written (tests/cron/nightly.sql, run
               with psql in a database shop), its 02:05 schedule then moved to this
               minute: tonight's run of its three steps, the job it registers drained

And, in the same cluster (PostgreSQL 15, where Debian packages pg_partman too), pg_partman's
maintenance as a chain's step that commits.
"""

import json
import re
import subprocess
import time
from collections import Counter
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from support import ROOT

# Bounded wait for the minute's runs: at most one minute boundary plus the runs.
MAX_WAIT = 75.0
# Schedule only early enough in a minute that pg_cron has reloaded its job list before
# the next boundary; later than this, wait for the next minute to start first.
LATEST_SECOND = 50.0
FINAL = ("succeeded", "failed")

ITEMS = 30
CHUNK = 10
CHAIN_STEPS = 5
RELAUNCHED = 200


def _items(ids):
    return sql.Literal(json.dumps([{"id": i, "revision": 1} for i in ids]))


def _setup(conn):
    """Everything the minute's cron jobs work on, in the test database."""
    conn.execute(
        """CREATE TABLE orders (
               tenant   text    NOT NULL,
               id       integer NOT NULL,
               revision integer NOT NULL DEFAULT 1,
               status   text    NOT NULL DEFAULT 'pending',
               PRIMARY KEY (tenant, id))"""
    )
    # Every changed row takes a little while, so that a chunk of 10 takes ~0.1 s and
    # the two runs of the same job string really overlap.
    conn.execute(
        """CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$"""
    )
    conn.execute(
        "CREATE TRIGGER slow_row BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION slow_row()"
    )
    conn.execute(
        """CREATE TABLE effects (
               batch text    NOT NULL,
               step  integer NOT NULL,
               pid   integer NOT NULL DEFAULT pg_backend_pid())"""
    )
    for tenant, count in (("F", ITEMS), ("T", ITEMS), ("C", 20), ("O", 10), ("R", RELAUNCHED)):
        conn.execute(
            "INSERT INTO orders (tenant, id) SELECT %s, g FROM generate_series(1, %s) g",
            (tenant, count),
        )
    for job, tenant, count in (("festival", "F", ITEMS), ("twice", "T", ITEMS),
                               ("clash", "C", 20), ("other", "O", 10), ("relaunch", "R", RELAUNCHED)):
        row = conn.execute(
            sql.SQL(
                "SELECT created, items, chunks FROM etc_batch.register_job("
                "{job}, {tenant}, 'orders', {items}, {chunk}, "
                """'{{"status": "cancelled"}}', '{{"status": "pending"}}')"""
            ).format(
                job=sql.Literal(job),
                tenant=sql.Literal(tenant),
                items=_items(range(1, count + 1)),
                chunk=sql.Literal(CHUNK),
            )
        ).fetchone()
        assert row == (True, count, -(-count // CHUNK))
    # The conflict: item 15 of 'clash' (chunk 2) changes after its approval.
    conn.execute("UPDATE orders SET revision = revision + 1 WHERE tenant = 'C' AND id = 15")

    chain = []
    for k in range(1, CHAIN_STEPS + 1):
        chain.append(
            conn.execute(
                "SELECT etc_batch.add_step('chain', %s)",
                (f"INSERT INTO effects (batch, step) VALUES ('chain', {k}); SELECT pg_sleep(0.2)",),
            ).fetchone()[0]
        )
    fails = [
        conn.execute(
            "SELECT etc_batch.add_step('fails', %s)", (command,)
        ).fetchone()[0]
        for command in (
            "INSERT INTO effects (batch, step) VALUES ('fails', 1)",
            "SELECT 1/0",
            "INSERT INTO effects (batch, step) VALUES ('fails', 3)",
        )
    ]
    _nights(conn)
    return chain, fails


def _nights(conn):
    """The nightly chains: 'nightly', run by the minute; 'nights', night 1 done and night
    2 failed at its second step before it."""
    conn.execute("CREATE TABLE knob (ok boolean)")
    conn.execute("INSERT INTO knob VALUES (false)")
    for chain in ("nightly", "nights"):
        conn.execute("SELECT etc_batch.define_chain(%s, time_zone => 'UTC')", (chain,))
        conn.execute("SELECT etc_batch.add_step(%s, %s)", (
            chain, f"INSERT INTO effects (batch, step) VALUES ('{chain} ' || etc_batch.current_run(), 1); "
                   "SELECT pg_sleep(0.2)"))
        conn.execute("SELECT etc_batch.add_step(%s, %s)", (
            chain, "SELECT 1 / (SELECT count(*)::int FROM knob WHERE ok)"))
        conn.execute("SELECT etc_batch.add_step(%s, %s)", (
            chain, f"INSERT INTO effects (batch, step) VALUES ('{chain} ' || etc_batch.current_run(), 3)"))
    conn.execute("UPDATE knob SET ok = true")
    assert conn.execute("CALL etc_batch.run_chain('nights', '2026-12-01')").fetchone() == (
        "nights/2026-12-01", "done")
    conn.execute("UPDATE knob SET ok = false")
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("CALL etc_batch.run_chain('nights', '2026-12-02')")
    conn.execute("UPDATE knob SET ok = true")


def _cron_jobs(chain, fails):
    """(cron job name, case, command) for the minute."""
    twice = "CALL etc_batch.drain_job('twice')"
    run_chain = f"CALL etc_batch.exec_batch_from_id({chain[0]})"
    return [
        ("etc festival", "festival", "CALL etc_batch.drain_job('festival', 5)"),
        ("etc twice a", "twice", twice),
        ("etc twice b", "twice", twice),
        ("etc chain a", "chain", run_chain),
        ("etc chain b", "chain", run_chain),
        ("etc fails", "fails", f"CALL etc_batch.exec_batch_from_id({fails[0]})"),
        ("etc clash", "clash", "CALL etc_batch.drain_job('clash')"),
        ("etc multi", "multi",
         "SET statement_timeout = '1min'; CALL etc_batch.drain_job('other')"),
        ("etc resume", "resume", "SELECT etc_batch.resume_launches()"),
        ("etc nightly a", "nightly", "CALL etc_batch.run_chain('nightly', '2026-12-01')"),
        ("etc nightly b", "nightly", "CALL etc_batch.run_chain('nightly', '2026-12-01')"),
        ("etc night 2", "night 2", "CALL etc_batch.run_chain('nights', '2026-12-02')"),
        ("etc night 3", "night 3", "CALL etc_batch.run_chain('nights', '2026-12-03')"),
    ]


HOW_TO = ROOT / "tests" / "cron" / "nightly.sql"
LOOK = ROOT / "tests" / "cron" / "nightly_look.sql"


def _nightly_how_to(cluster, cron):
    """docs/how-to/nightly-chain.md's block, run by psql as written in a database shop:
    the chain and its 02:05 schedule. Its cron job's id and row. The psql on PATH, as
    tests/clients runs it (on 17 the server's own runs only inside its Debian root)."""
    with cluster.connect("postgres") as conn:
        conn.execute("CREATE DATABASE shop")
    done = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(cluster.socket_dir),
         "-p", str(cluster.port), "-U", "postgres", "-d", "shop", "-f", str(HOW_TO)],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    row = cron.execute("SELECT jobid, schedule, command, database FROM cron.job "
                       "WHERE jobname = 'etc_batch nightly'").fetchone()
    return row["jobid"], row


def _orphan_a_launch(conn):
    """A launch of job 'relaunch' whose worker and supervisor are terminated after its
    first chunk, as a restart of the server ends them: with etc_batch not preloaded,
    nothing starts them again. Its launch id."""
    launch_id = conn.execute("SELECT launch_id FROM etc_batch.launch_job('relaunch')").fetchone()[0]
    deadline = time.monotonic() + 30
    while conn.execute("SELECT chunks_committed FROM etc_batch.job WHERE job_id = 'relaunch'").fetchone()[0] < 1:
        assert time.monotonic() < deadline, "the launched worker committed no chunk"
        time.sleep(0.01)
    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE backend_type IN ('etc_batch worker', 'etc_batch supervisor') "
                 "AND datname = current_database()")
    while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type IN "
                       "('etc_batch worker', 'etc_batch supervisor') "
                       "AND datname = current_database()").fetchone()[0]:
        assert time.monotonic() < deadline, "the worker and the supervisor did not end"
        time.sleep(0.05)
    status, committed = conn.execute("SELECT status::text, chunks_committed FROM etc_batch.job "
                                     "WHERE job_id = 'relaunch'").fetchone()
    assert status == "pending" and committed < RELAUNCHED // CHUNK, (status, committed)
    return launch_id


@pytest.fixture(scope="module")
def minute(cron_cluster, cron_timings):
    """Prepares every case, runs the minute, returns what the tests assert on."""
    db = cron_cluster.connect(row_factory=dict_row)
    cron = cron_cluster.connect("postgres", row_factory=dict_row)
    scheduled = []
    try:
        with cron_cluster.connect() as setup_conn:
            chain, fails = _setup(setup_conn)
            orphaned = _orphan_a_launch(setup_conn)
        jobs = _cron_jobs(chain, fails)
        how_to_job, how_to = _nightly_how_to(cron_cluster, cron)

        second = cron.execute(
            "SELECT extract(second FROM clock_timestamp())::float8 AS s"
        ).fetchone()["s"]
        if second > LATEST_SECOND:
            time.sleep(60.0 - second + 0.5)

        # All at once, in one transaction: pg_cron reloads its job list once.
        cron.autocommit = False
        with cron.transaction():
            for name, _case, command in jobs:
                jobid = cron.execute(
                    "SELECT cron.schedule_in_database(%s, '* * * * *', %s, %s) AS jobid",
                    (name, command, cron_cluster.test_db),
                ).fetchone()["jobid"]
                scheduled.append(jobid)
            # the how-to's own schedule, moved from 02:05 to this minute
            cron.execute("SELECT cron.alter_job(%s, schedule := '* * * * *')", (how_to_job,))
            scheduled.append(how_to_job)
            jobs.append(("etc_batch nightly", "how-to", how_to["command"]))
        cron.autocommit = True
        nodes = {
            r["nodename"]
            for r in cron.execute(
                "SELECT nodename FROM cron.job WHERE jobid = ANY(%s)", (scheduled,)
            ).fetchall()
        }
        assert nodes == {str(cron_cluster.socket_dir)}

        started = time.monotonic()
        deadline = started + MAX_WAIT
        while True:
            finished = {
                r["jobid"]
                for r in cron.execute(
                    "SELECT DISTINCT jobid FROM cron.job_run_details "
                    "WHERE jobid = ANY(%s) AND status IN ('succeeded', 'failed')",
                    (scheduled,),
                ).fetchall()
            }
            if finished >= set(scheduled):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after {MAX_WAIT:.0f}s only cron jobs {sorted(finished)} of "
                    f"{scheduled} have finished a run; job_run_details: "
                    f"{cron.execute('SELECT * FROM cron.job_run_details').fetchall()}"
                )
            time.sleep(0.25)
        waited = time.monotonic() - started

        # Nothing may fire again, and nothing may still be running when tests look.
        cron.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobid = ANY(%s)",
                     (scheduled,))
        unscheduled, scheduled = scheduled, []

        def quiet():
            in_flight = cron.execute(
                "SELECT count(*) AS n FROM cron.job_run_details "
                "WHERE status NOT IN ('succeeded', 'failed')"
            ).fetchone()["n"]
            busy = cron.execute(
                "SELECT count(*) AS n FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() AND state <> 'idle'",
                (cron_cluster.test_db,),
            ).fetchone()["n"]
            return in_flight == 0 and busy == 0

        quiet_deadline = time.monotonic() + 20
        while not quiet():
            assert time.monotonic() < quiet_deadline, "cron runs still in flight after 20s"
            time.sleep(0.1)
        cron_timings["wait for the minute's runs"] = waited
        print(f"\npg_cron: all {len(jobs)} cron jobs finished a run {waited:.1f}s after scheduling")

        runs = cron.execute(
            """SELECT jobid, runid, job_pid, status, return_message, start_time, end_time
                 FROM cron.job_run_details WHERE jobid = ANY(%s) ORDER BY runid""",
            (unscheduled,),
        ).fetchall()
        job_of = dict(zip(unscheduled, jobs))
        by_case = {}
        for r in runs:
            r["jobname"], case, _command = job_of[r["jobid"]]
            by_case.setdefault(case, []).append(r)
            message = (r["return_message"] or "").strip().replace("\n", " | ")
            print(f"  {r['jobname']:<12} pid {r['job_pid']:<7} {r['status']:<9} {message}")
        with cron_cluster.connect("shop", row_factory=dict_row) as shop:
            yield {"db": db, "runs": by_case, "all_runs": runs, "chain": chain, "fails": fails,
                   "jobs": jobs, "orphaned": orphaned, "how_to": how_to, "shop": shop,
                   "socket_dir": cron_cluster.socket_dir, "port": cron_cluster.port}
    finally:
        if scheduled:
            cron.autocommit = True
            cron.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobid = ANY(%s)",
                         (scheduled,))
        db.close()
        cron.close()


# helpers -----------------------------------------------------------------------------------


def job_row(db, job):
    return db.execute(
        "SELECT status, next_index, chunks_committed, problem FROM etc_batch.job WHERE job_id = %s",
        (job,),
    ).fetchone()


def audit_by_key(db, job):
    rows = db.execute(
        "SELECT item_key, count(*) AS n FROM etc_batch.job_audit_items WHERE job_id = %s GROUP BY item_key",
        (job,),
    ).fetchall()
    return {int(r["item_key"]): r["n"] for r in rows}


def orders(db, tenant):
    rows = db.execute(
        "SELECT id, revision, status FROM orders WHERE tenant = %s ORDER BY id", (tenant,)
    ).fetchall()
    return {r["id"]: (r["revision"], r["status"]) for r in rows}


def one_run(minute, case):
    runs = minute["runs"].get(case, [])
    assert len(runs) == 1, f"{case}: expected exactly one run, got {runs}"
    return runs[0]


def assert_overlap(runs):
    a, b = runs
    assert a["start_time"] < b["end_time"] and b["start_time"] < a["end_time"], (
        f"the two runs did not overlap: {[(r['start_time'], r['end_time']) for r in runs]}"
    )


# tests -----------------------------------------------------------------------------------


def test_every_cron_job_ran_once_in_the_minute(minute):
    runs = minute["all_runs"]
    assert Counter(r["jobname"] for r in runs) == Counter(n for n, _c, _cmd in minute["jobs"])
    assert all(r["status"] in FINAL for r in runs)
    # fired at the same minute boundary
    assert len({r["start_time"].replace(second=0, microsecond=0) for r in runs}) == 1


def test_drain_job_from_cron_runs_the_job_to_done(minute):
    db = minute["db"]
    run = one_run(minute, "festival")
    assert run["status"] == "succeeded", run["return_message"]
    j = job_row(db, "festival")
    assert (j["status"], j["next_index"], j["chunks_committed"]) == ("done", ITEMS, 3)
    assert audit_by_key(db, "festival") == {k: 1 for k in range(1, ITEMS + 1)}
    assert orders(db, "F") == {k: (2, "cancelled") for k in range(1, ITEMS + 1)}


def test_same_drain_job_scheduled_twice_processes_each_key_once(minute):
    db = minute["db"]
    runs = minute["runs"]["twice"]
    assert len(runs) == 2
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"], runs
    assert_overlap(runs)
    j = job_row(db, "twice")
    assert (j["status"], j["next_index"], j["chunks_committed"]) == ("done", ITEMS, 3)
    assert audit_by_key(db, "twice") == {k: 1 for k in range(1, ITEMS + 1)}
    # each row changed exactly once: revision 1 -> 2
    assert orders(db, "T") == {k: (2, "cancelled") for k in range(1, ITEMS + 1)}
    chunks = db.execute(
        "SELECT chunk, count(*) AS n, count(DISTINCT txid) AS txids FROM etc_batch.job_audit "
        "WHERE job_id = 'twice' GROUP BY chunk ORDER BY chunk"
    ).fetchall()
    assert [(c["chunk"], c["n"], c["txids"]) for c in chunks] == [(1, 10, 1), (2, 10, 1), (3, 10, 1)]


def test_chain_scheduled_twice_runs_each_step_once(minute):
    db = minute["db"]
    chain = minute["chain"]
    runs = minute["runs"]["chain"]
    assert len(runs) == 2
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"], runs
    assert_overlap(runs)
    effects = db.execute(
        "SELECT step, count(*) AS n FROM effects WHERE batch = 'chain' GROUP BY step ORDER BY step"
    ).fetchall()
    assert [(e["step"], e["n"]) for e in effects] == [(k, 1) for k in range(1, CHAIN_STEPS + 1)]
    steps = db.execute(
        "SELECT id, status, attempts FROM etc_batch.batch_log WHERE batch = 'chain' ORDER BY id"
    ).fetchall()
    assert [(s["id"], s["status"], s["attempts"]) for s in steps] == [
        (i, "done", 1) for i in chain
    ]
    audit = db.execute(
        "SELECT step_id, pid, outcome FROM etc_batch.step_audit WHERE batch = 'chain'"
    ).fetchall()
    # each run visited every step once: one of them ran it, the other skipped it
    assert Counter((a["step_id"], a["outcome"]) for a in audit) == Counter(
        {**{(i, "done"): 1 for i in chain}, **{(i, "skipped"): 1 for i in chain}}
    )
    # the audit's pids are the two cron runs' backends
    assert {a["pid"] for a in audit} == {r["job_pid"] for r in runs}
    # the step commands ran in the backend that recorded them as done
    done_pid = {a["step_id"]: a["pid"] for a in audit if a["outcome"] == "done"}
    effects = db.execute("SELECT step, pid FROM effects WHERE batch = 'chain'").fetchall()
    assert {chain[e["step"] - 1]: e["pid"] for e in effects} == done_pid


def test_failing_step_fails_the_cron_run(minute):
    db = minute["db"]
    fails = minute["fails"]
    run = one_run(minute, "fails")
    assert run["status"] == "failed"
    assert "division by zero" in run["return_message"]
    steps = db.execute(
        "SELECT id, status, attempts, last_sqlstate FROM etc_batch.batch_log "
        "WHERE batch = 'fails' ORDER BY id"
    ).fetchall()
    assert [(s["id"], s["status"], s["attempts"], s["last_sqlstate"]) for s in steps] == [
        (fails[0], "done", 1, None),
        (fails[1], "failed", 1, "22012"),
        (fails[2], "pending", 0, None),
    ]
    effects = db.execute(
        "SELECT step, count(*) AS n FROM effects WHERE batch = 'fails' GROUP BY step"
    ).fetchall()
    assert [(e["step"], e["n"]) for e in effects] == [(1, 1)]


def test_conflict_fails_the_cron_run(minute):
    db = minute["db"]
    run = one_run(minute, "clash")
    assert run["status"] == "failed"
    assert 'job "clash" is in conflict' in run["return_message"]
    j = job_row(db, "clash")
    assert (j["status"], j["next_index"], j["chunks_committed"]) == ("conflict", 10, 1)
    assert j["problem"]["key"] == "15"
    assert audit_by_key(db, "clash") == {k: 1 for k in range(1, 11)}
    rows = orders(db, "C")
    assert {k: rows[k] for k in range(1, 11)} == {k: (2, "cancelled") for k in range(1, 11)}
    # chunk 2 rolled back: 15 keeps the revision it was changed to, the rest are untouched
    assert {k: rows[k] for k in range(11, 21)} == {
        k: (2 if k == 15 else 1, "pending") for k in range(11, 21)
    }


def test_multi_statement_job_string_is_refused(minute):
    db = minute["db"]
    run = one_run(minute, "multi")
    assert run["status"] == "failed"
    assert "cannot run" in run["return_message"], run["return_message"]
    assert "etc_batch.drain_job" in run["return_message"]
    j = job_row(db, "other")
    assert (j["status"], j["next_index"], j["chunks_committed"]) == ("pending", 0, 0)
    assert audit_by_key(db, "other") == {}
    assert orders(db, "O") == {k: (1, "pending") for k in range(1, 11)}


def test_partition_maintenance_runs_as_a_step(cron_cluster):
    """pg_partman's run_maintenance_proc, a procedure that commits between partition
    sets, as a step that commits: the partition premake asks for is made, the step done."""
    with cron_cluster.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS partman")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman")
        conn.execute("CREATE TABLE public.events (at timestamptz NOT NULL, v int) PARTITION BY RANGE (at)")
        # pg_partman 5 (Debian 13's) names the interval and the type anew; 4 (Debian 12's)
        # takes them in the other order
        version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_partman'").fetchone()[0]
        interval, kind = ("1 day", "range") if int(version.split(".")[0]) >= 5 else ("daily", "native")
        conn.execute("SELECT partman.create_parent(p_parent_table => 'public.events', p_control => 'at', "
                     "p_interval => %s, p_type => %s, p_premake => 2)", (interval, kind))

        def six_days_ahead_exists():
            # the partition premake = 6 asks for, as pg_partman names it
            return conn.execute(
                "SELECT table_exists FROM partman.show_partition_name('public.events', "
                "(now() + interval '6 days')::text)").fetchone()[0]

        assert not six_days_ahead_exists()
        # infinite_time_partitions: partitions ahead even while the table has no rows
        conn.execute("UPDATE partman.part_config SET premake = 6, infinite_time_partitions = true "
                     "WHERE parent_table = 'public.events'")
        step = conn.execute("SELECT etc_batch.add_step('maintenance', "
                            "'CALL partman.run_maintenance_proc()', commits => true)").fetchone()[0]
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (step,))
        assert conn.execute("SELECT status FROM etc_batch.batch_log WHERE id = %s",
                            (step,)).fetchone() == ("done",)
        assert six_days_ahead_exists()


def test_a_schedule_of_resume_launches_finishes_a_launch_a_restart_left(minute):
    """Without etc_batch preloaded, a launch whose processes a restart ended waits; the
    one-line schedule resumes it, and the job finishes, each item once."""
    db = minute["db"]
    run = one_run(minute, "resume")
    assert run["status"] == "succeeded", run["return_message"]
    launch_id = minute["orphaned"]
    deadline = time.monotonic() + 60
    while db.execute("SELECT status FROM etc_batch.launch WHERE launch_id = %s",
                     (launch_id,)).fetchone()["status"] == "running":
        assert time.monotonic() < deadline, "the resumed launch did not end"
        time.sleep(0.1)
    assert db.execute("SELECT status FROM etc_batch.launch WHERE launch_id = %s",
                      (launch_id,)).fetchone()["status"] == "done"
    runs = db.execute("SELECT run, started_by, outcome FROM etc_batch.launches WHERE launch_id = %s "
                      "ORDER BY run", (launch_id,)).fetchall()
    assert [(r["started_by"], r["outcome"]) for r in runs] == [("launch", "interrupted"), ("resume", "done")], runs
    assert job_row(db, "relaunch")["status"] == "done"
    assert audit_by_key(db, "relaunch") == {k: 1 for k in range(1, RELAUNCHED + 1)}
    assert orders(db, "R") == {k: (2, "cancelled") for k in range(1, RELAUNCHED + 1)}


def effects_of(db, chain):
    return Counter((r["batch"], r["step"]) for r in db.execute(
        "SELECT batch, step FROM effects WHERE batch LIKE %s", (chain + " %",)).fetchall())


def test_nightly_line_fired_by_two_schedules_makes_one_run(minute):
    db = minute["db"]
    runs = minute["runs"]["nightly"]
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"], runs
    assert db.execute("SELECT batch FROM etc_batch.chain_run WHERE chain = 'nightly'").fetchall() == [
        {"batch": "nightly/2026-12-01"}]
    assert effects_of(db, "nightly") == Counter({("nightly 2026-12-01", 1): 1, ("nightly 2026-12-01", 3): 1})
    audit = db.execute(
        "SELECT step_id, count(*) FILTER (WHERE outcome = 'done') AS ran, count(DISTINCT pid) AS callers "
        "FROM etc_batch.step_audit WHERE batch = 'nightly/2026-12-01' GROUP BY step_id ORDER BY step_id").fetchall()
    assert [(r["ran"], r["callers"]) for r in audit] == [(1, 2), (1, 2), (1, 2)], audit


def test_last_nights_failure_is_held_and_tonight_waits_its_turn(minute):
    db = minute["db"]
    held = one_run(minute, "night 2")
    # the failed step is not run again by the schedule: the run fails, naming it
    assert held["status"] == "failed"
    assert 'has failed' in held["return_message"], held["return_message"]
    failed = db.execute("SELECT id, attempts FROM etc_batch.batch_log "
                        "WHERE batch = 'nights/2026-12-02' AND status = 'failed'").fetchall()
    assert [r["attempts"] for r in failed] == [1]
    waiting = one_run(minute, "night 3")
    assert waiting["status"] == "succeeded", waiting["return_message"]
    assert db.execute("SELECT count(*) AS n FROM etc_batch.batch_log WHERE batch = 'nights/2026-12-03' "
                      "AND status = 'pending'").fetchone()["n"] == 3
    assert effects_of(db, "nights") == Counter({("nights 2026-12-01", 1): 1, ("nights 2026-12-01", 3): 1,
                                                ("nights 2026-12-02", 1): 1})

    # the failure retried on purpose; the same lines then finish night 2, then night 3
    db.execute("SELECT etc_batch.retry_step(%s)", (failed[0]["id"],))
    assert db.execute("CALL etc_batch.run_chain('nights', '2026-12-02')").fetchone() == {
        "run": "nights/2026-12-02", "status": "done"}
    assert db.execute("CALL etc_batch.run_chain('nights', '2026-12-03')").fetchone() == {
        "run": "nights/2026-12-03", "status": "done"}
    assert effects_of(db, "nights") == Counter({(f"nights 2026-12-0{n}", step): 1
                                                for n in (1, 2, 3) for step in (1, 3)})
    # the failure the retry cleared stays in step_audit
    assert db.execute("SELECT count(*) AS n FROM etc_batch.step_audit WHERE step_id = %s AND outcome = 'failed'",
                      (failed[0]["id"],)).fetchone()["n"] == 1


def test_the_nightly_how_to_runs_as_written_from_its_schedule(minute):
    how_to, shop = minute["how_to"], minute["shop"]
    assert (how_to["schedule"], how_to["database"], how_to["command"]) == (
        "5 2 * * *", "shop", "CALL etc_batch.run_chain('nightly')")
    assert [r["status"] for r in minute["runs"]["how-to"]] == ["succeeded"]
    runs = shop.execute("SELECT run_key, batch FROM etc_batch.chain_run WHERE chain = 'nightly'").fetchall()
    assert len(runs) == 1, runs
    run_key, batch = runs[0]["run_key"], runs[0]["batch"]
    # tonight is the date in the chain's time zone when pg_cron fired
    fired = minute["runs"]["how-to"][0]["start_time"]
    assert run_key == fired.astimezone(ZoneInfo("Europe/Berlin")).date().isoformat()
    assert batch == f"nightly/{run_key}"
    assert shop.execute("SELECT steps, done, failed, pending FROM etc_batch.chain_progress "
                        "WHERE batch = %s", (batch,)).fetchone() == {
        "steps": 3, "done": 3, "failed": 0, "pending": 0}
    job = shop.execute("SELECT job_id, status::text, item_count, chunks_committed FROM etc_batch.job").fetchall()
    # an order placed exactly 7 days before the insert is older than that when the step
    # reads it
    old_unpaid = shop.execute(
        "SELECT count(*) AS n FROM generate_series(1, 500) g WHERE g % 3 = 0 AND g >= 7 * 24").fetchone()["n"]
    assert job == [{"job_id": f"cancel-unpaid-{run_key}", "status": "done",
                    "item_count": old_unpaid, "chunks_committed": 1}]
    # the how-to's queries that look at a night, as written
    looked = subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-h", str(minute["socket_dir"]),
         "-p", str(minute["port"]), "-U", "postgres", "-d", "shop", "-f", str(LOOK)],
        capture_output=True, text=True, timeout=60)
    assert looked.returncode == 0, looked.stderr
    assert re.search(rf"{re.escape(batch)} \|\s+3 \|\s+3 \|\s+0 \|\s+0 \|", looked.stdout), looked.stdout
    assert re.search(rf"cancel-unpaid-{run_key} \| done\s+\|\s+{old_unpaid} \|\s+{old_unpaid}",
                     looked.stdout), looked.stdout
    assert shop.execute("SELECT status, count(*) AS n FROM orders GROUP BY status ORDER BY status").fetchall() == [
        {"status": "cancelled", "n": old_unpaid},
        {"status": "paid", "n": 500 - 500 // 3},
        {"status": "unpaid", "n": 500 // 3 - old_unpaid}]
