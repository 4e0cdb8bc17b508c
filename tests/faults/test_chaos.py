"""A randomized chaos run: for a bounded time (ETC_BATCH_CHAOS_SECONDS, 180 by default;
`bench/run chaos MINUTES` runs it longer and keeps its report), sequential and parallel
jobs and chains run while an application updates the same tables, the jobs are paused,
resumed and paced at random, and faults strike at random: a drainer's client cut off
from the network, the target tables' disk full, pg_terminate_backend of a drainer or a
chain's runner, SIGKILL of a backend (the server's crash and recovery), an immediate
restart. The work comes in rounds: when every job of a round has ended and every chain
of it has run to its end, the next round registers new jobs over the same rows (each
round sets the note to a value of its own) and new chains, so that a longer run keeps
the faults striking work in flight. Afterwards every job is drained and every chain run
to its end, and the invariants are checked:

- every row is changed by etc_batch at most once, and every item of a job that is done
  exactly once (or skipped, by a job that skips drifted items);
- one audit row per changed item, written in the transaction that changed it;
- no step of a chain done twice, and every step done once;
- verify_job clean on every job not in conflict;
- every conflict, and every item a job skipped, is a drift the application made: the
  row found is one the application's update of that approved row wrote after the job
  was registered; a job in conflict committed some of its items, each changed once,
  and left the rest unprocessed, unchanged;
- nothing held by a session that is gone: no session lock of etc_batch's, no drainer;
- every kind of fault struck at least once (a kind not struck yet is chosen more often).

The seed is printed first; ETC_BATCH_CHAOS_SEED=<seed> runs the same schedule of work
and faults again (the threads' timing on the machine is not the seed's to fix).
"""

import collections
import json
import os
import random
import re
import signal
import subprocess
import threading
import time

import psycopg
import pytest

from conftest import HOME, SERVER_NS, SmallDisk, pg_ctl_in, server_in_namespace
from support import size_from_env, wait_until
from work import verify

SEED = int(os.environ.get("ETC_BATCH_CHAOS_SEED") or random.SystemRandom().randrange(1, 2**31))
# below a minute, a run would hardly strike each kind of fault, and proves little
SECONDS = size_from_env("ETC_BATCH_CHAOS_SECONDS", 180, least=60, kind=float)
REPORT = os.environ.get("ETC_BATCH_CHAOS_REPORT")

TABLES = 5
ROWS = 4000
APPROVED = 3000  # ids 1 to 3000 of each table; the application mostly updates the rest
CHAINS = 2
STEPS = 25
CLIENT_SETTINGS = ("keepalives_idle=1 keepalives_interval=1 keepalives_count=2 tcp_user_timeout=2000 "
                   "options='-c tcp_user_timeout=2000 -c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 "
                   "-c tcp_keepalives_count=2 -c client_connection_check_interval=500'")
# what a call may end with while faults strike: a session ended (57P01, 57P02), the
# server not yet accepting (57P03), a full disk, a cancel, a business conflict, a job
# not in a state to drain (paused, in conflict), contention that outlasted the retries
EXPECTED = {"57P01", "57P02", "57P03", "53100", "57014", "23000", "55000", "40001", "40P01", "55P03", None}
# the faults the controller strikes with, by the name the report gives each
FAULTS = {"terminate": "pg_terminate_backend", "cut": "client link cut", "disk": "disk full",
          "sigkill": "SIGKILL of a backend", "restart": "immediate restart"}


class Chaos:
    def __init__(self, cluster, disk, rng):
        self.cluster = cluster
        self.disk = disk
        self.rng = rng
        self.stop = threading.Event()
        self.errors = collections.Counter()
        self.unexpected = []
        self.faults = collections.Counter()
        # the faults that struck: a backend terminated, a link down, a disk filled...
        self.struck = collections.Counter()
        self.actions = collections.Counter()
        self.calls = collections.Counter()
        self.samples = collections.defaultdict(list)
        self.lock = threading.Lock()
        self.jobs = {}
        self.chains = []
        self.rounds = 0

    def next_round(self, conn):
        """Registers the next round's jobs and chains; the workers take them up."""
        with conn.transaction():  # a round registered whole or not at all (a full disk)
            jobs, chains = prepare_round(conn, self.rng, self.rounds + 1)
        self.rounds += 1
        self.jobs.update(jobs)
        self.chains += chains
        # whole lists replaced at once: the workers' threads read them without the lock
        self.current_jobs = list(jobs)
        self.current_chains = chains

    def round_over(self):
        rows = self.run_sql(
            "SELECT (SELECT count(*) FROM etc_batch.job WHERE job_id = ANY(%s) AND status NOT IN ('done', 'conflict'))"
            " + (SELECT count(*) FROM etc_batch.batch_log WHERE batch = ANY(%s) AND status <> 'done')",
            (self.current_jobs, self.current_chains))
        return bool(rows) and rows[0][0] == 0

    # -- connections that survive the server's restarts --------------------------------

    def connect(self):
        return self.cluster.connect(connect_timeout=5)

    def up(self):
        try:
            with self.connect() as conn:
                return conn.execute("SELECT NOT pg_is_in_recovery()").fetchone()[0]
        except psycopg.Error:
            return False

    def count(self, counter, what):
        """One more of `what`: the threads count into the same counters."""
        with self.lock:
            counter[what] += 1

    def note(self, sqlstate, what):
        with self.lock:
            self.errors[sqlstate or "connection"] += 1
            if len(self.samples[sqlstate]) < 2:
                self.samples[sqlstate].append(what[:300])
            if sqlstate not in EXPECTED:
                self.unexpected.append((sqlstate, what))

    def run_sql(self, sql, args=None):
        """Runs sql on a fresh connection; errors are counted, never raised. Without
        args, sql is sent as it is (with args, even empty ones, psycopg would read each
        % of a LIKE pattern as a placeholder, and the statement would never run)."""
        try:
            with self.connect() as conn:
                conn.execute("SET client_min_messages = warning")
                cur = conn.execute(sql, args)
                return cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            sqlstate = getattr(e, "sqlstate", None)
            # no SQLSTATE: a connection lost, or a statement the client could not send,
            # which is the test's own error
            if sqlstate is None and not isinstance(e, psycopg.OperationalError):
                sqlstate = f"client: {type(e).__name__}"
            self.note(sqlstate, f"{sql}: {e}")
            return None

    # -- the work ----------------------------------------------------------------------

    def drainer(self, n):
        rng = random.Random(SEED * 100 + n)
        while not self.stop.is_set():
            job = rng.choice(self.current_jobs)
            chunks = rng.randrange(1, 30)
            if rng.random() < 0.4:
                self.drain_over_the_network(job, chunks)
            else:
                self.count(self.calls, "drain")
                self.run_sql("CALL etc_batch.drain_job(%s, %s)", (job, chunks))
            time.sleep(rng.uniform(0, 0.2))

    def drain_over_the_network(self, job, chunks):
        """psql on host etcb-cli, whose link the faults cut, with the settings that make
        both ends give up on a silent peer."""
        link = self.cluster.link("client")
        self.count(self.calls, "drain over the network")
        conninfo = (f"host={link.server_addr} port={self.cluster.port} user=postgres "
                    f"dbname={self.cluster.test_db} connect_timeout=5 {CLIENT_SETTINGS}")
        try:
            done = subprocess.run(
                ["ip", "netns", "exec", link.ns, str(self.cluster.bin_dir / "psql"), "-X", "-q",
                 "-v", "VERBOSITY=sqlstate", "-c", "SET client_min_messages = warning",
                 "-c", f"CALL etc_batch.drain_job('{job}', {chunks})", conninfo],
                capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            self.note("timeout", f"psql drain of {job} ran 60 s")
            return
        if done.returncode != 0:
            m = re.search(r"ERROR:  ([0-9A-Z]{5})", done.stderr)
            self.note(m.group(1) if m else None, done.stderr.strip())

    def runner(self):
        rng = random.Random(SEED * 100 + 50)
        while not self.stop.is_set():
            batch = rng.choice(self.current_chains)
            rows = self.run_sql("SELECT min(id) FROM etc_batch.batch_log WHERE batch = %s AND status <> 'done'",
                                (batch,))
            if rows and rows[0][0] is not None:
                self.count(self.calls, "chain run")
                self.run_sql(f"CALL etc_batch.exec_batch_from_id({int(rows[0][0])})")
            time.sleep(rng.uniform(0, 0.3))

    def application(self):
        rng = random.Random(SEED * 100 + 60)
        while not self.stop.is_set():
            table = f"t{rng.randrange(1, TABLES + 1)}"
            # now and then a row a job approved: it drifts
            row = rng.randrange(1, APPROVED + 1) if rng.random() < 0.02 else rng.randrange(APPROVED + 1, ROWS + 1)
            self.count(self.calls, "application update")
            self.run_sql(f"UPDATE {table} SET balance = balance + 1 WHERE id = %s", (row,))
            time.sleep(rng.uniform(0, 0.05))

    # -- the controller: pauses, paces and faults ------------------------------------

    def controller(self, deadline):
        rng = self.rng
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 2.0))
            if self.round_over():
                try:
                    with self.connect() as conn:
                        self.next_round(conn)
                except psycopg.Error as e:
                    self.note(getattr(e, "sqlstate", None), f"the next round: {e}")
            kind = rng.choices(
                ["pause", "resume", "pace", "terminate", "cut", "disk", "sigkill", "restart"],
                weights=[3, 4, 3, 3, 2, 2, 1, 1])[0]
            # a kind of fault that has not struck yet, every other time: a short run
            # strikes with every kind too
            owed = [k for k, name in FAULTS.items() if not self.struck[name]]
            if owed and rng.random() < 0.5:
                kind = rng.choice(owed)
            job = rng.choice(self.current_jobs)
            if kind == "pause":
                self.count(self.actions, "pause_job")
                self.run_sql("SELECT etc_batch.pause_job(%s)", (job,))
            elif kind == "resume":
                self.count(self.actions, "resume_job")
                self.run_sql("SELECT etc_batch.resume_job(%s)", (job,))
            elif kind == "pace":
                self.count(self.actions, "pace_job")
                rate = rng.choice([None, 50, 200, 1000])
                self.run_sql("SELECT etc_batch.pace_job(%s, %s)", (job, rate))
            elif kind == "terminate":
                self.count(self.faults, FAULTS[kind])
                rows = self.run_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
                    "AND (query LIKE '%etc_batch: %' OR query LIKE 'CALL etc_batch.%') "
                    "ORDER BY random() LIMIT 1")
                if rows and rows[0][0]:
                    self.count(self.struck, FAULTS[kind])
            elif kind == "cut":
                self.count(self.faults, FAULTS[kind])
                link = self.cluster.link("client")
                link.cut()
                self.count(self.struck, FAULTS[kind])
                time.sleep(rng.uniform(1, 4))
                link.mend()
            elif kind == "disk":
                self.count(self.faults, FAULTS[kind])
                try:
                    self.disk.fill(0)
                    self.count(self.struck, FAULTS[kind])
                except OSError:
                    pass
                time.sleep(rng.uniform(0.5, 3))
                self.disk.make_room()
            elif kind == "sigkill":
                rows = self.run_sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                    "AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1")
                if rows:
                    self.count(self.faults, FAULTS[kind])
                    try:
                        os.kill(rows[0][0], signal.SIGKILL)
                        self.count(self.struck, FAULTS[kind])
                    except ProcessLookupError:
                        pass
                    wait_until(self.up, "the server back after a backend's SIGKILL", timeout=60)
            elif kind == "restart":
                self.count(self.faults, FAULTS[kind])
                self.restart()
                self.count(self.struck, FAULTS[kind])

    def restart(self):
        c = self.cluster
        pg_ctl_in(SERVER_NS, c.data_dir, c.socket_dir / "server.log", "-m", "immediate", "-w", "stop")
        pg_ctl_in(SERVER_NS, c.data_dir, c.socket_dir / "server.log", "-w", "start")
        wait_until(self.up, "the server back after an immediate restart", timeout=60)


@pytest.fixture(scope="module")
def chaos_cluster():
    disk = SmallDisk(HOME / "chaos-disk", 64 * 1024 * 1024)
    try:
        with server_in_namespace(("max_connections = 60",)) as cluster:
            with cluster.connect("postgres") as conn:
                conn.execute(f"CREATE TABLESPACE chaos LOCATION '{disk.tablespace_dir}'")
            yield cluster, disk
    finally:
        disk.unmount()


def prepare_tables(conn):
    """Five tables (no revision column), a log of every change to their note (the jobs')
    and one of every change to their balance (the application's): the drifts."""
    conn.execute("CREATE TABLE note_log (tbl text NOT NULL, id bigint NOT NULL, note text NOT NULL, "
                 "txid bigint NOT NULL)")
    conn.execute("""CREATE FUNCTION log_note() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN INSERT INTO note_log VALUES (TG_TABLE_NAME, NEW.id, NEW.note, txid_current());
                    RETURN NEW; END $$""")
    conn.execute("CREATE TABLE balance_log (tbl text NOT NULL, id bigint NOT NULL, balance int NOT NULL, "
                 "xid xid8 NOT NULL)")
    conn.execute("""CREATE FUNCTION log_balance() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN INSERT INTO balance_log VALUES (TG_TABLE_NAME, NEW.id, NEW.balance, pg_current_xact_id());
                    RETURN NEW; END $$""")
    # what was committed when each round began to register its jobs
    conn.execute("CREATE TABLE round_start (round int PRIMARY KEY, snapshot pg_snapshot NOT NULL)")
    for t in range(1, TABLES + 1):
        conn.execute(f"CREATE TABLE t{t} (id bigint PRIMARY KEY, note text NOT NULL, balance int NOT NULL) "
                     "TABLESPACE chaos")
        conn.execute(f"INSERT INTO t{t} SELECT g, 'n', 0 FROM generate_series(1, {ROWS}) g")
        conn.execute(f"CREATE TRIGGER log_note AFTER UPDATE ON t{t} FOR EACH ROW "
                     "WHEN (OLD.note IS DISTINCT FROM NEW.note) EXECUTE FUNCTION log_note()")
        conn.execute(f"CREATE TRIGGER log_balance AFTER UPDATE ON t{t} FOR EACH ROW "
                     "WHEN (OLD.balance IS DISTINCT FROM NEW.balance) EXECUTE FUNCTION log_balance()")
    conn.execute("CREATE TABLE ran (batch text NOT NULL, step int NOT NULL, txid bigint NOT NULL)")


def prepare_round(conn, rng, n):
    """Round n: five jobs, one per table (three sequential, two parallel; on_drift stop or
    skip and the chunk at random), setting the note to 'rN', paced at 300 items a second;
    and two chains of 25 steps."""
    jobs = {}
    # taken before any job of the round reads its rows: a change visible in it is no drift
    conn.execute("INSERT INTO round_start VALUES (%s, pg_current_snapshot())", (n,))
    for t in range(1, TABLES + 1):
        job, parallel = f"j{t}r{n}", t > 3
        on_drift = rng.choice(["stop", "skip"])
        chunk = rng.randrange(5, 40)
        conn.execute(
            "SELECT etc_batch.register_job(%s, NULL, %s::regclass, "
            "(SELECT jsonb_agg(jsonb_build_object('id', g) ORDER BY g) FROM generate_series(1, %s) g), "
            "%s, jsonb_build_object('note', %s::text), tenant_column => NULL, revision_column => NULL, "
            "on_drift => %s, parallel => %s)", (job, f"t{t}", APPROVED, chunk, f"r{n}", on_drift, parallel))
        conn.execute("SELECT etc_batch.pace_job(%s, 300)", (job,))
        jobs[job] = dict(table=f"t{t}", note=f"r{n}", parallel=parallel, on_drift=on_drift, chunk=chunk, round=n)
    chains = [f"chain{c}r{n}" for c in range(1, CHAINS + 1)]
    for batch in chains:
        for s in range(1, STEPS + 1):
            conn.execute("SELECT etc_batch.add_step(%s, %s)", (
                batch, f"DO $$ BEGIN INSERT INTO ran VALUES ('{batch}', {s}, txid_current()); "
                       f"PERFORM pg_sleep(0.2); END $$"))
    return jobs, chains


def finish(conn, jobs, chains):
    """After the faults: every job drained to its end (done, or stopped in conflict) and
    every chain run to its end."""
    for job in jobs:
        conn.execute("SELECT etc_batch.resume_job(%s)", (job,))
        conn.execute("SELECT etc_batch.pace_job(%s, NULL)", (job,))
        status = conn.execute("SELECT status FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()[0]
        if status == "pending":
            try:
                conn.execute("CALL etc_batch.drain_job(%s)", (job,))
            except psycopg.errors.IntegrityConstraintViolation:
                # a conflict: the job stopped there (check_invariants ties it to a drift)
                status = conn.execute("SELECT status FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()[0]
                assert status == "conflict", (job, status)
    for batch in chains:
        first = conn.execute("SELECT min(id) FROM etc_batch.batch_log WHERE batch = %s AND status <> 'done'",
                             (batch,)).fetchone()[0]
        if first is not None:
            conn.execute(f"CALL etc_batch.exec_batch_from_id({first})")


def drifted(conn, job, j, key, found):
    """The row `found` for item `key` of `job` is one the application's update of that
    approved row wrote, and committed after the job's round began to register: a real
    drift. (Each balance a row has is written once: the application only adds to it.)"""
    assert found is not None and found["id"] == key, (job, key, found)
    assert found["note"] != j["note"], (job, key, found)
    wrote = conn.execute(
        "SELECT count(*) FROM balance_log b, round_start s WHERE s.round = %s AND b.tbl = %s "
        "AND b.id = %s AND b.balance = %s AND NOT pg_visible_in_snapshot(b.xid, s.snapshot)",
        (j["round"], j["table"], key, found["balance"])).fetchone()[0]
    assert wrote == 1, (job, key, found, wrote)


def in_conflict(conn, job, j, changed, skipped):
    """A job in conflict: the item it stopped at drifted (the application changed its
    row); its items are the committed ones, each changed once (or skipped), and the
    unprocessed ones, unchanged; a sequential job committed every chunk before the one
    that holds the item, and none after."""
    problem = conn.execute("SELECT problem FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()[0]
    assert j["on_drift"] == "stop", (job, problem)
    key, position = int(problem["key"]), problem["position"]
    drifted(conn, job, j, key, problem["found"])
    approved, committed, unprocessed = conn.execute(
        "SELECT approved, committed, unprocessed FROM etc_batch.job_summary(%s)", (job,)).fetchone()
    assert approved == APPROVED and committed + unprocessed == approved, (job, approved, committed, unprocessed)
    assert committed == len(changed) + skipped and key not in changed, (job, committed, len(changed), skipped)
    if not j["parallel"]:
        assert committed <= position < committed + j["chunk"], (job, committed, position)


def check_invariants(conn, jobs, chains):
    """The invariants of the run; returns what each job ended as."""
    twice = conn.execute("SELECT tbl, id, note, count(*) FROM note_log GROUP BY 1, 2, 3 "
                         "HAVING count(*) > 1").fetchall()
    assert twice == [], f"rows changed more than once: {twice[:10]}"
    ended = {}
    for job, j in jobs.items():
        status = conn.execute("SELECT status FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()[0]
        assert status in ("done", "conflict"), (job, status)
        audited = set(conn.execute(
            "SELECT item_key::bigint, txid FROM etc_batch.job_audit_items WHERE job_id = %s AND outcome = 'changed'",
            (job,)).fetchall())
        logged = set(conn.execute("SELECT id, txid FROM note_log WHERE tbl = %s AND note = %s",
                                  (j["table"], j["note"])).fetchall())
        # one audit row per changed item, in the transaction that changed it, and no other change
        assert audited == logged, (job, sorted(audited ^ logged)[:10])
        items = conn.execute("SELECT count(*) FROM etc_batch.job_audit WHERE job_id = %s", (job,)).fetchone()[0]
        # each item a job skipped was a drift: the row it found, the application wrote
        skipped = conn.execute("SELECT item_key::bigint, found FROM etc_batch.job_audit_items "
                               "WHERE job_id = %s AND outcome = 'skipped'", (job,)).fetchall()
        assert not skipped or j["on_drift"] == "skip", (job, skipped[:3])
        for key, found in skipped:
            drifted(conn, job, j, key, found)
        if status == "done":
            assert items == APPROVED, (job, items)
            verify(conn, job)
        else:
            in_conflict(conn, job, j, {id for id, _ in logged}, len(skipped))
        ended[job] = status
    steps = conn.execute("SELECT batch, id, status FROM etc_batch.batch_log ORDER BY id").fetchall()
    assert all(s == "done" for _, _, s in steps), steps
    ran = conn.execute("SELECT batch, step, count(*) FROM ran GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    assert ran == sorted((batch, s, 1) for batch in chains for s in range(1, STEPS + 1)), ran
    done_twice = conn.execute("SELECT step_id FROM etc_batch.step_audit WHERE outcome = 'done' "
                              "GROUP BY step_id HAVING count(*) > 1").fetchall()
    assert done_twice == []
    return ended


def test_chaos(chaos_cluster):
    cluster, disk = chaos_cluster
    print(f"\nchaos seed {SEED}, {SECONDS:.0f} s: ETC_BATCH_CHAOS_SEED={SEED} runs this schedule again")
    rng = random.Random(SEED)
    chaos = Chaos(cluster, disk, rng)
    with cluster.connect() as conn:
        prepare_tables(conn)
        chaos.next_round(conn)
    workers = [threading.Thread(target=chaos.drainer, args=(n,), daemon=True) for n in range(3)]
    workers += [threading.Thread(target=chaos.runner, daemon=True),
                threading.Thread(target=chaos.application, daemon=True)]
    started = time.monotonic()
    for w in workers:
        w.start()
    try:
        chaos.controller(started + SECONDS)
    finally:
        chaos.stop.set()
        cluster.link("client").mend()
        if disk.ballast.exists():
            disk.make_room()
        for w in workers:
            w.join(timeout=90)
    assert not any(w.is_alive() for w in workers), "a worker did not stop"
    if not chaos.up():
        chaos.restart()
    with cluster.connect() as conn:
        # the sessions of the run are gone: nothing of theirs may be held
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid()").fetchone()[0] == 0, "the run's sessions to end", timeout=60)
        held = conn.execute("SELECT pid, objsubid FROM pg_locks WHERE locktype = 'advisory' "
                            "AND objsubid >= 3").fetchall()
        assert held == [], held
        jobs, chains = chaos.jobs, chaos.chains
        finish(conn, jobs, chains)
        ended = check_invariants(conn, jobs, chains)
        assert conn.execute("SELECT count(*) FROM etc_batch.job_progress WHERE drainers > 0").fetchone()[0] == 0
    report = {
        "seed": SEED, "seconds": SECONDS, "rounds": chaos.rounds, "jobs": {j: {**jobs[j], "ended": ended[j]} for j in jobs},
        "faults": dict(chaos.faults), "faults that struck": dict(chaos.struck), "actions": dict(chaos.actions), "calls": dict(chaos.calls),
        "errors seen by callers": dict(chaos.errors),
        "what they said": {k or "connection": v for k, v in chaos.samples.items()}, "invariants": "held",
    }
    print(json.dumps(report, indent=1))
    if REPORT:
        with open(REPORT, "w") as f:
            json.dump(report, f, indent=1)
    assert chaos.unexpected == [], chaos.unexpected[:10]
    # every kind of fault struck
    assert all(chaos.struck[name] for name in FAULTS.values()), dict(chaos.struck)
