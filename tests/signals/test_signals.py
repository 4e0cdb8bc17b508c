"""The signals of a job's pace on a live server: each wait holds nothing, names its
reason in pg_stat_activity and job_progress.waiting, and ends when the system recovers;
every item is changed exactly once whatever the waits.

- WAL archiving that fails on purpose until it is mended: the backlog grows, a drain
  waits (max_archive_backlog), and one with pause_above_archive_backlog is paused
- a VACUUM of the target held open (an aggressive one waiting for a page a cursor pins)
- a window that closes during a drain, set from another session; a launched worker that
  waits for its window to open
- a throttle query that flips
"""

import json
import threading
import time
import uuid
from collections import Counter

from psycopg import sql

from conftest import ARCHIVING
from support import close_quietly, wait_until


def tag(label):
    return f"{label}_{uuid.uuid4().hex[:8]}"


def make_orders(conn, n):
    table = tag("orders")
    conn.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int NOT NULL DEFAULT 1, "
                         "status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))")
                 .format(sql.Identifier(table)))
    conn.execute(sql.SQL("INSERT INTO {} (tenant, id) SELECT 'X', g FROM generate_series(1, %s) g")
                 .format(sql.Identifier(table)), (n,))
    return table


def register(conn, table, n, chunk_size, label):
    job = tag(label)
    items = [{"id": i, "revision": 1} for i in range(1, n + 1)]
    conn.execute("SELECT etc_batch.register_job(%s, 'X', %s::regclass, %s::jsonb, %s, %s::jsonb)",
                 (job, table, json.dumps(items), chunk_size, json.dumps({"status": "cancelled"})))
    return job


def audit_by_key(conn, job):
    return Counter({int(k): n for k, n in conn.execute(
        "SELECT item_key, count(*) FROM etc_batch.job_audit_items WHERE job_id = %s GROUP BY item_key",
        (job,))})


def committed(conn, job):
    return sum(audit_by_key(conn, job).values())


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
            cur = self.conn.execute(statement, params)
            self.result = cur.fetchone() if cur.description else cur.statusmessage
        except BaseException as exc:  # for the test to assert on
            self.error = exc

    def join(self, timeout=60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the call did not return; notices {self.notices[-5:]}"
        assert self.error is None, self.error
        return self.result


def assert_waits_holding_nothing(admin, pid, job, what, worker=False):
    """Backend `pid` waits for `what` (as pg_stat_activity and job_progress.waiting both
    say) with no transaction id, no snapshot and no lock but its virtual transaction id
    and the mark of a drainer at work (a session lock of etc_batch's own key space; a
    launched worker also holds the mark of being that worker)."""
    wait_until(lambda: what in (admin.execute(
        "SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] or ""),
        f"the drain to wait: {what}")
    held = admin.execute(
        "SELECT backend_xid, backend_xmin FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    locks = admin.execute(
        "SELECT locktype, objsubid FROM pg_locks WHERE pid = %s ORDER BY 1", (pid,)).fetchall()
    assert tuple(held) == (None, None), held
    marks = [("advisory", 4)] + ([("advisory", 5)] if worker else [])
    assert sorted(tuple(l) for l in locks) == sorted(marks + [("virtualxid", None)]), locks
    waiting = admin.execute(
        "SELECT waiting FROM etc_batch.job_progress WHERE job_id = %s", (job,)).fetchone()[0]
    assert waiting and waiting.startswith(f'job "{job}": {what}'), waiting


def assert_done_once(conn, job, n):
    assert audit_by_key(conn, job) == Counter({i: 1 for i in range(1, n + 1)})
    assert conn.execute("SELECT status FROM etc_batch.job_progress WHERE job_id = %s",
                        (job,)).fetchone() == ("done",)


def ready_segments(conn):
    return conn.execute("SELECT count(*) FROM pg_ls_archive_statusdir() "
                        "WHERE name LIKE '%.ready'").fetchone()[0]


def fill_archive_backlog(conn, segments):
    """Archiving broken: `segments` WAL segments are switched out and wait."""
    ARCHIVING.unlink(missing_ok=True)
    for _ in range(segments):
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS wal_filler (x int); INSERT INTO wal_filler VALUES (1)")
        conn.execute("SELECT pg_switch_wal()")
    wait_until(lambda: ready_segments(conn) >= segments, f"{segments} segments to wait for archiving")


def mend_archiving(conn):
    ARCHIVING.touch()
    # a new segment wakes the archiver at once, instead of at its next minute
    conn.execute("INSERT INTO wal_filler VALUES (1)")
    conn.execute("SELECT pg_switch_wal()")
    wait_until(lambda: ready_segments(conn) == 0, "the archiver to catch up", timeout=90)


def test_a_drain_waits_while_archiving_falls_behind_and_goes_on_when_it_recovers(signals):
    admin = signals.connect()
    try:
        table = make_orders(admin, 200)
        job = register(admin, table, 200, 20, "archive")
        admin.execute("SELECT etc_batch.pace_job(%s, max_archive_backlog => 2)", (job,))
        fill_archive_backlog(admin, 4)
        drain = Call(signals.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        assert_waits_holding_nothing(admin, drain.pid, job, "waiting for WAL archiving")
        time.sleep(1.5)
        assert committed(admin, job) == 0, "a chunk committed while archiving was behind"
        mend_archiving(admin)
        assert drain.join()[4] == "done"
        assert_done_once(admin, job, 200)
        told = [n for n in drain.notices if " waits: " in n]
        assert len(told) == 1 and "WAL segments wait to be archived, more than max_archive_backlog 2" in told[0], told
    finally:
        ARCHIVING.touch()
        close_quietly([admin])


def test_an_archive_backlog_above_the_critical_limit_pauses_the_job(signals):
    admin = signals.connect()
    try:
        table = make_orders(admin, 100)
        job = register(admin, table, 100, 10, "archive_critical")
        admin.execute("SELECT etc_batch.pace_job(%s, pause_above_archive_backlog => 2)", (job,))
        fill_archive_backlog(admin, 3)
        drainer = signals.connect()
        result = drainer.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
        assert result[4] == "paused" and result[1] == 0, result
        reason = admin.execute("SELECT pause_reason FROM etc_batch.job_progress WHERE job_id = %s",
                               (job,)).fetchone()[0]
        assert reason.endswith("WAL segments waited to be archived, more than pause_above_archive_backlog 2"), reason
        log = signals.server_log()
        assert f'etc_batch paused job "{job}": ' in log
        # paused: a person resumes, once archiving is mended
        mend_archiving(admin)
        admin.execute("SELECT etc_batch.resume_job(%s)", (job,))
        assert drainer.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4] == "done"
        assert_done_once(admin, job, 100)
    finally:
        ARCHIVING.touch()
        close_quietly([admin])


def test_a_drain_yields_to_a_vacuum_of_its_table(signals):
    admin = signals.connect()
    holder = signals.connect(autocommit=False)
    vacuum = None
    try:
        table = make_orders(admin, 200)
        job = register(admin, table, 200, 20, "vacuum")
        admin.execute("SELECT etc_batch.pace_job(%s, yield_to_vacuum => true)", (job,))
        # a cursor pins the table's first page; an aggressive VACUUM waits for it
        holder.execute(sql.SQL("DECLARE pin CURSOR FOR SELECT * FROM {}").format(sql.Identifier(table)))
        holder.execute("FETCH 1 FROM pin")
        vacuum = Call(signals.connect(), sql.SQL("VACUUM (FREEZE) {}").format(sql.Identifier(table)))
        wait_until(lambda: admin.execute(
            "SELECT count(*) FROM pg_stat_progress_vacuum WHERE relid = %s::regclass", (table,)
        ).fetchone()[0] == 1, "the VACUUM to be at work on the table")
        drain = Call(signals.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        assert_waits_holding_nothing(admin, drain.pid, job, "waiting for a VACUUM of its table")
        time.sleep(1.5)
        assert committed(admin, job) == 0, "a chunk committed next to the VACUUM"
        holder.rollback()
        vacuum.join()
        assert drain.join()[4] == "done"
        assert_done_once(admin, job, 200)
        assert any(f"a VACUUM (process {vacuum.pid}) works on its table" in n for n in drain.notices), drain.notices
    finally:
        close_quietly([holder, admin])


def test_a_window_that_closes_mid_drain_stops_the_call_and_opens_again(signals):
    admin = signals.connect()
    try:
        table = make_orders(admin, 400)
        job = register(admin, table, 400, 10, "window")
        # about four seconds of work at 100 rows a second, inside a window of the whole week
        admin.execute("SELECT etc_batch.pace_job(%s, 100, windows => ARRAY['mon-sun 00:00-24:00'])",
                      (job,))
        drain = Call(signals.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        wait_until(lambda: committed(admin, job) >= 50, "the drain to be under way")
        # from another session: only a day that is not today (in UTC) is left
        not_today = admin.execute(
            "SELECT lower(to_char(now() AT TIME ZONE 'UTC' + interval '2 days', 'Dy'))").fetchone()[0]
        admin.execute("SELECT etc_batch.pace_job(%s, 100, windows => ARRAY[%s], time_zone => 'UTC')",
                      (job, f"{not_today} 00:00-24:00"))
        result = drain.join()
        assert result[4] == "outside_windows", result
        stopped_at = committed(admin, job)
        assert 50 <= stopped_at < 400 and result[1] == stopped_at, (result, stopped_at)
        assert any("is outside its windows; this call stops here" in n for n in drain.notices)
        # a CALL now returns at once, and changes nothing
        again = signals.connect().execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
        assert again[4] == "outside_windows" and again[1] == 0, again
        # the window opens: the next call finishes, every item once
        admin.execute("SELECT etc_batch.pace_job(%s, windows => ARRAY['mon-sun 00:00-24:00'])", (job,))
        assert signals.connect().execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4] == "done"
        assert_done_once(admin, job, 400)
    finally:
        close_quietly([admin])


def test_a_launched_worker_waits_for_its_window_holding_nothing(signals):
    admin = signals.connect()
    try:
        table = make_orders(admin, 200)
        job = register(admin, table, 200, 20, "worker_window")
        not_today = admin.execute(
            "SELECT lower(to_char(now() AT TIME ZONE 'UTC' + interval '2 days', 'Dy'))").fetchone()[0]
        admin.execute("SELECT etc_batch.pace_job(%s, windows => ARRAY[%s], time_zone => 'UTC')",
                      (job, f"{not_today} 00:00-24:00"))
        launch_id, pids = admin.execute("SELECT launch_id, pids FROM etc_batch.launch_job(%s)",
                                        (job,)).fetchone()
        assert len(pids) == 1
        assert_waits_holding_nothing(admin, pids[0], job, "waiting for its windows", worker=True)
        time.sleep(1.5)
        assert committed(admin, job) == 0
        # the window opens: the worker goes on by itself and finishes
        admin.execute("SELECT etc_batch.pace_job(%s, windows => ARRAY['mon-sun 00:00-24:00'])", (job,))
        wait_until(lambda: admin.execute(
            "SELECT outcome FROM etc_batch.launches WHERE launch_id = %s", (launch_id,)
        ).fetchone()[0] == "done", "the launch's worker to finish")
        assert_done_once(admin, job, 200)
    finally:
        close_quietly([admin])


def test_a_throttle_query_that_flips(signals):
    admin = signals.connect()
    try:
        table = make_orders(admin, 200)
        job = register(admin, table, 200, 20, "throttle")
        admin.execute("CREATE TABLE IF NOT EXISTS throttle (busy boolean NOT NULL)")
        admin.execute("TRUNCATE throttle; INSERT INTO throttle VALUES (true)")
        admin.execute("SELECT etc_batch.pace_job(%s, throttle_query => 'SELECT busy FROM throttle')",
                      (job,))
        drain = Call(signals.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        assert_waits_holding_nothing(admin, drain.pid, job, "waiting for its throttle_query")
        time.sleep(1.5)
        assert committed(admin, job) == 0
        admin.execute("UPDATE throttle SET busy = false")
        assert drain.join()[4] == "done"
        assert_done_once(admin, job, 200)
        assert sum(1 for n in drain.notices if "its throttle_query says to wait" in n) == 1, drain.notices
    finally:
        close_quietly([admin])
