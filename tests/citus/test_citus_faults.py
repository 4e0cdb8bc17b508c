"""A Citus cluster's failures with a job's chunk in flight: a worker stopped at once and
started again, the coordinator or a worker stopped between a chunk's PREPARE on its
worker and its COMMIT PREPARED, a launched job and a chain through the same. Every item
changed exactly once, verify_job clean, and nothing left prepared on any node once
Citus's recovery has run.

The moment between the two phases is held still, not hoped for: the coordinator is made
to wait for a synchronous standby that does not exist (synchronous_standby_names), which
it does after its commit record is written and flushed and before its commit callbacks
run, where Citus sends COMMIT PREPARED. Its workers then hold the chunk prepared for as
long as the test likes.
"""

import threading
import time

import psycopg
from conftest import table
from test_citus import ORDERS, exactly_once, orders, register

from support import wait_until


class Drain(threading.Thread):
    """CALL etc_batch.drain_job in a session of its own, its outcome kept."""

    def __init__(self, citus, job, call=None):
        super().__init__(daemon=True)
        self.citus, self.job, self.call = citus, job, call or "CALL etc_batch.drain_job(%s)"
        self.error = None
        self.pid = None
        self.started = threading.Event()

    def run(self):
        try:
            with self.citus.connect() as conn:
                self.pid = conn.info.backend_pid
                self.started.set()
                conn.execute(self.call, (self.job,))
        except Exception as e:  # the server stopped under it, or the worker did
            self.error = e
        finally:
            self.started.set()


def kept(request, made):
    """Enters `made` (a table's context) for the rest of the test."""
    value = made.__enter__()
    request.addfinalizer(lambda: made.__exit__(None, None, None))
    return value


def held_in_syncrep(citus, drain):
    """Waits until the drain's commit waits for the standby that does not exist, with its
    worker's part prepared."""
    def waiting():
        with citus.connect() as conn:
            return conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                (drain.pid,)).fetchone() == ("SyncRep",)
    wait_until(waiting, "the chunk's commit waiting in SyncRep", timeout=60)
    wait_until(lambda: any(w.prepared() for w in citus.workers), "a worker holding the chunk prepared")


def wait_for_no_standby(citus, on):
    """Commits on the coordinator wait for a synchronous standby that never connects (on)
    or not (off)."""
    with citus.connect() as conn:
        if on:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        else:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("SELECT pg_reload_conf()")


def start_with_no_standby_named(citus):
    """Starts the stopped coordinator without the standby it waited for: its
    postgresql.auto.conf edited, as a DBA would, since ALTER SYSTEM needs it running."""
    auto = citus.coordinator.data_dir / "postgresql.auto.conf"
    kept = [line for line in auto.read_text().splitlines(keepends=True)
            if not line.startswith("synchronous_standby_names")]
    auto.write_text("".join(kept))
    citus.coordinator.start()


def drain_to_done(citus, job, attempts=5):
    """Drains the job until it is done, as a DBA calls drain_job again after a failure."""
    for _ in range(attempts):
        with citus.connect() as conn:
            try:
                conn.execute("CALL etc_batch.drain_job(%s)", (job,))
            except psycopg.Error:
                time.sleep(1)
            if conn.execute("SELECT status FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone() == ("done",):
                return
    raise AssertionError(f"job {job} not done after {attempts} drains")


def test_a_worker_stopped_at_once_while_its_chunk_waits_on_a_lock(citus):
    """The worker holding the chunk's shard stops (immediate) while the chunk's UPDATE
    waits there on a row lock: the chunk fails and rolls back on the coordinator, the
    drain ends or retries; the worker is started again and the job drained to done."""
    with orders(citus, "orders_wstop") as t, citus.connect() as conn:
        register(conn, "wstop", t, 50)
        # chunk 1's first item: the first customer of the first shard, in shard order
        customer = conn.execute("SELECT (item_key::jsonb ->> 0)::int FROM etc_batch.job_item "
                                "WHERE job_id = 'wstop' AND position = 0").fetchone()[0]
        worker = citus.worker_of(t, customer)
        shard = conn.execute("SELECT get_shard_id_for_distribution_column(%s, %s)", (t, customer)).fetchone()[0]
        blocker = worker.connect(autocommit=False)
        blocker.execute(f"SELECT 1 FROM {t}_{shard} WHERE customer = %s AND id = 1 FOR UPDATE", (customer,))
        drain = Drain(citus, "wstop")
        drain.start()
        drain.started.wait(10)

        def waiting_on_worker():
            with worker.connect() as w:
                return w.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                 "AND query LIKE 'UPDATE%%'").fetchone()[0] == 1
        wait_until(waiting_on_worker, "the chunk's UPDATE waiting on the worker")
        worker.stop("immediate")
        blocker.close()
        time.sleep(2)
        worker.start()
        drain.join(timeout=300)
        assert not drain.is_alive()
        drain_to_done(citus, "wstop")
        exactly_once(conn, "wstop", t, 2000)
        assert citus.settled() == {n.name: [] for n in citus.nodes}


def test_the_coordinator_stopped_between_prepare_and_commit(citus, request):
    """The coordinator stops (immediate) after its commit record of chunk 1, while the
    chunk's worker holds it prepared: once started again, Citus's recovery commits the
    prepared part, the checkpoint says chunk 1 is done, and the drain goes on from chunk
    2. Nothing is changed twice, nothing lost."""
    t = kept(request, orders(citus, "orders_cstop"))
    with citus.connect() as conn:
        register(conn, "cstop", t, 50)
    wait_for_no_standby(citus, on=True)
    drain = Drain(citus, "cstop")
    try:
        drain.start()
        drain.started.wait(10)
        held_in_syncrep(citus, drain)
        citus.coordinator.stop("immediate")
    except BaseException:
        wait_for_no_standby(citus, on=False)
        raise
    start_with_no_standby_named(citus)
    drain.join(timeout=60)
    assert drain.error is not None  # its server stopped under it
    assert citus.settled() == {n.name: [] for n in citus.nodes}
    with citus.connect() as conn:
        # chunk 1 committed everywhere: its 50 rows once, the checkpoint past it
        assert conn.execute("SELECT next_index FROM etc_batch.job WHERE job_id = 'cstop'").fetchone() == (50,)
        assert conn.execute(f"SELECT count(*) FROM {t} WHERE updates = 1").fetchone() == (50,)
        drain_to_done(citus, "cstop")
        exactly_once(conn, "cstop", t, 2000)


def test_a_worker_stopped_between_prepare_and_commit(citus, request):
    """The chunk's worker stops (immediate) holding the chunk prepared, the coordinator's
    commit record already written: the coordinator's COMMIT PREPARED cannot reach it;
    when the worker is started again, Citus's recovery commits what it kept prepared."""
    t = kept(request, orders(citus, "orders_wprep"))
    with citus.connect() as conn:
        register(conn, "wprep", t, 50)
    wait_for_no_standby(citus, on=True)
    drain = Drain(citus, "wprep", call="CALL etc_batch.drain_job(%s, 1)")
    try:
        drain.start()
        drain.started.wait(10)
        held_in_syncrep(citus, drain)
        worker = next(w for w in citus.workers if w.prepared())
        worker.stop("immediate")
    finally:
        wait_for_no_standby(citus, on=False)
    drain.join(timeout=120)
    assert not drain.is_alive()
    worker.start()
    assert citus.settled() == {n.name: [] for n in citus.nodes}
    with citus.connect() as conn:
        assert conn.execute("SELECT next_index FROM etc_batch.job WHERE job_id = 'wprep'").fetchone() == (50,)
        assert conn.execute(f"SELECT count(*) FROM {t} WHERE updates = 1").fetchone() == (50,)
        drain_to_done(citus, "wprep")
        exactly_once(conn, "wprep", t, 2000)


def wait_launch(citus, launch_id, timeout=300):
    """Waits for a launch to end; returns its status."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with citus.connect() as conn:
                row = conn.execute(
                    "SELECT l.status, EXISTS (SELECT FROM etc_batch.launch_run r WHERE r.launch_id = l.launch_id "
                    "AND r.ended_at IS NULL AND r.pid IN (SELECT pid FROM pg_stat_activity)) "
                    "FROM etc_batch.launch l WHERE l.launch_id = %s", (launch_id,)).fetchone()
                if row[0] != "running" and not row[1]:
                    return row[0]
        except psycopg.OperationalError:
            pass  # the coordinator is restarting
        assert time.monotonic() < deadline, f"launch {launch_id} did not end"
        time.sleep(0.2)


def test_a_launched_job_through_a_worker_stop_and_a_coordinator_restart(citus, request):
    """A job launched with no client session held, paced so that it lasts: a worker
    stopped at once and started again, then the coordinator restarted at once (the
    launcher resumes the launch after recovery). Launched again if it ended failed, as a
    DBA would: every row once."""
    t = kept(request, orders(citus, "orders_launch"))
    with citus.connect() as conn:
        register(conn, "launched", t, 50)
        conn.execute("SELECT etc_batch.pace_job('launched', rows_per_second => 500)")
        launch_id = conn.execute("SELECT launch_id FROM etc_batch.launch_job('launched')").fetchone()[0]
        wait_until(lambda: conn.execute("SELECT next_index FROM etc_batch.job WHERE job_id = 'launched'")
                   .fetchone()[0] >= 200, "the launch to commit a few chunks")
    citus.workers[0].stop("immediate")
    time.sleep(1)
    citus.workers[0].start()
    with citus.connect() as conn:
        before = conn.execute("SELECT next_index FROM etc_batch.job WHERE job_id = 'launched'").fetchone()[0]
    citus.coordinator.stop("immediate")
    citus.coordinator.start()
    for _ in range(3):
        if wait_launch(citus, launch_id) == "done":
            break
        with citus.connect() as conn:
            launch_id = conn.execute("SELECT launch_id FROM etc_batch.launch_job('launched')").fetchone()[0]
    with citus.connect() as conn:
        assert before < 2000
        exactly_once(conn, "launched", t, 2000)
    assert citus.settled() == {n.name: [] for n in citus.nodes}


def test_a_chain_step_that_writes_a_distributed_table_through_a_coordinator_stop(citus, request):
    """A chain whose steps each update one customer's rows of a distributed table (one
    worker each): the coordinator stops while step 1's commit is held between prepare
    and commit. After recovery, step 1 is done, its change committed once; the chain
    run again skips it and runs the rest, each once."""
    t = kept(request, table(citus, "ledger", ORDERS.format(name="ledger"), distribute="customer",
                            rows="INSERT INTO ledger (customer, id) SELECT c, i FROM generate_series(1, 3) c, "
                                 "generate_series(1, 10) i"))
    with citus.connect() as conn:
        first = None
        for customer in (1, 2, 3):
            sid = conn.execute("SELECT etc_batch.add_step('ledger-nightly', %s)",
                               (f"UPDATE {t} SET updates = updates + 1 WHERE customer = {customer}",)).fetchone()[0]
            first = first or sid
    wait_for_no_standby(citus, on=True)
    chain = Drain(citus, first, call="CALL etc_batch.exec_batch_from_id(%s)")
    try:
        chain.start()
        chain.started.wait(10)
        held_in_syncrep(citus, chain)
        citus.coordinator.stop("immediate")
    except BaseException:
        wait_for_no_standby(citus, on=False)
        raise
    start_with_no_standby_named(citus)
    chain.join(timeout=60)
    assert citus.settled() == {n.name: [] for n in citus.nodes}
    with citus.connect() as conn:
        assert conn.execute("SELECT status FROM etc_batch.batch_log WHERE id = %s", (first,)).fetchone() == ("done",)
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
        assert conn.execute(f"SELECT customer, updates, count(*) FROM {t} GROUP BY 1, 2 ORDER BY 1").fetchall() == \
            [(1, 1, 10), (2, 1, 10), (3, 1, 10)]
        outcomes = conn.execute("SELECT outcome, count(*) FROM etc_batch.step_audit s JOIN etc_batch.batch_log b "
                                "ON b.id = s.step_id WHERE b.batch = 'ledger-nightly' GROUP BY 1 ORDER BY 1"
                                ).fetchall()
        assert outcomes == [("done", 3), ("skipped", 1)]
