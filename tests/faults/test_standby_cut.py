"""A synchronous standby whose link is cut in the middle of a drain: the primary in
network namespace etcb-srv, the standby (synchronous_standby_names) on host etcb-sby,
streaming over their link. Commits wait in SyncRep while the link is down; pause_job
commits too and waits like them (unless its session commits locally); a cancel ends the
wait of the chunk in flight, which PostgreSQL keeps committed here with a WARNING, and
the call then ends with 57014 naming that chunk instead of telling of it as committed.
Every NOTICE the client received is true on the standby, after a reconnection and after
a failover to it, and every item is changed exactly once either way.
"""

import threading
import time

import psycopg
import pytest
from psycopg import errors

from conftest import pg_ctl_in, pgbouncer, server_in_namespace, start_standby
from support import wait_until
from work import changes, held_by_etc_batch, job_state, make_accounts, register, verify

ITEMS = 3000
CHUNK = 2


class Primary:
    def __init__(self, cluster, standby):
        self.cluster = cluster
        self.standby = standby

    def link(self):
        return self.cluster.link("standby")

    def caught_up(self):
        """Waits until the standby has replayed everything the primary wrote."""
        with self.cluster.connect() as conn:
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
            wait_until(lambda: conn.execute(
                "SELECT replay_lsn >= %s FROM pg_stat_replication WHERE application_name = 'faultsby'",
                (lsn,)).fetchone() == (True,), "the standby to catch up", timeout=60)


@pytest.fixture(scope="module")
def primary():
    with server_in_namespace() as cluster:
        standby = start_standby(cluster)
        with cluster.connect() as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'faultsby'")
            conn.execute("SELECT pg_reload_conf()")
            wait_until(lambda: conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()
                       == [("sync",)], "the standby to be synchronous")
        p = Primary(cluster, standby)
        try:
            yield p
        finally:
            p.link().mend()


@pytest.fixture
def db(primary, request):
    """A database of the test's own on the primary, made while the standby is linked."""
    name = "sync_" + str(abs(hash(request.node.name)) % 10**8)
    with primary.cluster.connect("postgres") as conn:
        conn.execute(f"CREATE DATABASE {name}")
    with primary.cluster.connect(name) as conn:
        conn.execute("CREATE EXTENSION etc_batch")
        make_accounts(conn, ITEMS)
        register(conn, "synced", ITEMS, CHUNK)
        # slow rows, so that the drain is caught half-way; not a pace, whose slots are
        # commits of their own between chunks (see test_a_cancel_between_chunks)
        conn.execute("""CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$
                        BEGIN PERFORM pg_sleep(0.002); RETURN NEW; END $$""")
        conn.execute("CREATE TRIGGER slow BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION slow()")
    primary.name = name
    yield name
    primary.link().mend()


class Drain:
    """CALL etc_batch.drain_job('synced') in a thread of its own, every message its client
    receives kept in order."""

    def __init__(self, connect):
        self.conn = connect()
        self.messages = []
        self.conn.add_notice_handler(lambda d: self.messages.append((d.severity, d.message_primary)))
        self.outcome = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.outcome["result"] = self.conn.execute("CALL etc_batch.drain_job('synced')").fetchone()
        except Exception as e:  # asserted on by the test
            self.outcome["error"] = e

    def told_committed(self):
        """(first key, last key) of every chunk the client was told committed."""
        told = []
        for severity, message in self.messages:
            if severity == "NOTICE" and " committed: " in message:
                keys = message.rsplit("keys ", 1)[1].split(" to ")
                told.append((int(keys[0]), int(keys[1])))
        return told

    def join(self):
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        return self.outcome


def all_true(conn, told):
    """Every chunk the client was told committed is on this server, each row once."""
    for first, last in told:
        assert conn.execute("SELECT count(DISTINCT id), count(*) FROM accounts_log WHERE id BETWEEN %s AND %s",
                            (first, last)).fetchone() == (last - first + 1,) * 2, (first, last)


def cancel_in_syncrep(primary, name, bouncer=None):
    """Starts a drain (through PgBouncer at `bouncer`, a conninfo, if given), cuts the
    standby's link under it, shows that commits wait and that pause_job does too, then
    cancels the drain: with pg_cancel_backend, or through PgBouncer with the client's own
    cancel request. Returns the drain and the chunk the cancel ended the wait of."""
    conn = primary.cluster.connect(name)
    if bouncer:
        drain = Drain(lambda: psycopg.connect(f"{bouncer} dbname={name} user=postgres", autocommit=True,
                                              prepare_threshold=None))
    else:
        drain = Drain(lambda: primary.cluster.connect(name))
    wait_until(lambda: job_state(conn, "synced")[1] >= 200, "the drain under way")
    (drain.pid,) = conn.execute(
        "SELECT drainer_pids FROM etc_batch.job_progress WHERE job_id = 'synced'").fetchone()[0]
    primary.link().cut()

    def in_syncrep():
        return conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                            (drain.pid,)).fetchone() == ("SyncRep",)

    wait_until(in_syncrep, "the drainer waiting in SyncRep")
    # a wait seen at once may be one whose reply from the standby was already on its way
    # when the link was cut (it ends, and the next chunk commits); a second later the wait
    # is the cut's
    time.sleep(1)
    wait_until(in_syncrep, "the drainer waiting in SyncRep")
    # the chunk's own commit waits: it holds the target's lock until the commit returns
    assert conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND relation = 'accounts'::regclass",
                        (drain.pid,)).fetchone() == (1,)
    held = conn.execute("SELECT next_index FROM etc_batch.job WHERE job_id = 'synced'").fetchone()[0]
    time.sleep(1)
    # commits wait: nothing more committed
    assert conn.execute("SELECT next_index FROM etc_batch.job WHERE job_id = 'synced'").fetchone()[0] == held
    # pause_job commits as well, and its commit waits as well (statement_timeout ends
    # before a commit, so only a cancel ends that wait, leaving the pause committed here)
    pauser = primary.cluster.connect(name)
    pausing = threading.Thread(target=lambda: pauser.execute("SELECT etc_batch.pause_job('synced')"),
                               daemon=True)
    pausing.start()
    wait_until(lambda: conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                    (pauser.info.backend_pid,)).fetchone() == ("SyncRep",),
               "pause_job waiting in SyncRep")
    conn.execute("SELECT pg_cancel_backend(%s)", (pauser.info.backend_pid,))
    pausing.join(timeout=10)
    assert not pausing.is_alive()
    assert conn.execute("SELECT count(*) FROM etc_batch.job_pause WHERE job_id = 'synced'").fetchone() == (1,)
    # committed locally, resume_job returns at once; the drainer still waits
    pauser.execute("SET synchronous_commit = local")
    pauser.execute("SELECT etc_batch.resume_job('synced')")
    assert conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                        (drain.pid,)).fetchone() == ("SyncRep",)
    # the chunk in flight is committed here, and waits; the cancel ends its wait
    if bouncer:
        drain.conn.cancel()
    else:
        conn.execute("SELECT pg_cancel_backend(%s)", (drain.pid,))
    outcome = drain.join()
    error = outcome.get("error")
    assert isinstance(error, errors.QueryCanceled), outcome
    # (a commit waiting for the standby is not yet visible to other sessions)
    chunk = held // CHUNK + 1
    assert error.diag.message_primary == f'canceled while chunk {chunk} of job "synced" waited for the synchronous standby'
    assert "committed on this server, but no synchronous standby has confirmed it" in error.diag.message_detail
    assert error.diag.message_hint == "Call etc_batch.drain_job('synced') to go on; its commits wait for the standby again."
    # PostgreSQL's own warning came first; the chunk was never told of as committed
    assert ("WARNING", "canceling wait for synchronous replication due to user request") in drain.messages
    told = drain.told_committed()
    assert told[-1][1] == (chunk - 1) * CHUNK
    # committed here
    assert job_state(conn, "synced") == ("pending", chunk * CHUNK)
    all_true(conn, told)
    return drain, chunk


@pytest.mark.parametrize("route", ["direct", "pgbouncer"])
def test_a_cancel_in_syncrep_then_the_standby_reconnects(primary, db, route):
    if route == "pgbouncer":
        with pgbouncer(primary.cluster, None, "127.0.0.1") as bouncer:
            drain, chunk = cancel_in_syncrep(primary, db, bouncer)
    else:
        drain, chunk = cancel_in_syncrep(primary, db)
    conn = primary.cluster.connect(db)
    # once the standby is back the job goes on, each item once, on both servers
    primary.link().mend()
    assert conn.execute("CALL etc_batch.drain_job('synced')").fetchone()[-1] == "done"
    assert job_state(conn, "synced") == ("done", ITEMS)
    assert changes(conn) == {1: ITEMS}
    verify(conn, "synced")
    primary.caught_up()
    with primary.standby.connect(db) as on_standby:
        assert changes(on_standby) == {1: ITEMS}
        all_true(on_standby, drain.told_committed())
    assert held_by_etc_batch(conn) == []


def test_a_chain_step_whose_wait_for_the_standby_is_canceled(primary, db):
    """A chain's step commits while the standby is cut off; the cancel ends the wait and
    the run, naming the step; once the standby is back, the chain goes on from there, the
    step not run again."""
    conn = primary.cluster.connect(db)
    conn.execute("CREATE TABLE ran (step int NOT NULL)")
    ids = [conn.execute("SELECT etc_batch.add_step('nightly', %s)", (f"INSERT INTO ran VALUES ({n})",)).fetchone()[0]
           for n in (1, 2, 3)]
    primary.link().cut()
    runner = primary.cluster.connect(db)
    messages = []
    runner.add_notice_handler(lambda d: messages.append((d.severity, d.message_primary)))
    outcome = {}

    def run():
        try:
            runner.execute(f"CALL etc_batch.exec_batch_from_id({ids[0]})")
        except Exception as e:  # asserted on below
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until(lambda: conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                    (runner.info.backend_pid,)).fetchone() == ("SyncRep",),
               "the runner waiting in SyncRep")
    conn.execute("SELECT pg_cancel_backend(%s)", (runner.info.backend_pid,))
    thread.join(timeout=30)
    error = outcome.get("error")
    assert isinstance(error, errors.QueryCanceled), outcome
    assert error.diag.message_primary == (
        f'canceled while step {ids[0]} of batch "nightly" waited for the synchronous standby')
    assert error.diag.message_hint == (
        f"Call etc_batch.exec_batch_from_id({ids[0]}) to go on; its commits wait for the standby again.")
    assert not any("committed" in m for _, m in messages), messages
    primary.link().mend()
    conn.execute(f"CALL etc_batch.exec_batch_from_id({ids[0]})")
    assert conn.execute("SELECT step, count(*) FROM ran GROUP BY step ORDER BY step").fetchall() == [
        (1, 1), (2, 1), (3, 1)]


def test_a_cancel_between_chunks_ends_the_call_at_once(primary, db):
    """A paced drain takes its slot in a transaction of its own before each chunk, and
    that commit waits for the standby too. A cancel that ends its wait (the slot committed
    here, nothing of the work) ends the call at once, with PostgreSQL's own cancel: no
    chunk starts, and nothing more waits for the standby on the way out."""
    conn = primary.cluster.connect(db)
    conn.execute("SELECT etc_batch.pace_job('synced', 300)")
    primary.link().cut()
    drain = Drain(lambda: primary.cluster.connect(db))
    wait_until(lambda: conn.execute("SELECT drainer_pids FROM etc_batch.job_progress "
                                    "WHERE job_id = 'synced'").fetchone()[0], "the drainer started")
    (pid,) = conn.execute("SELECT drainer_pids FROM etc_batch.job_progress WHERE job_id = 'synced'").fetchone()[0]
    wait_until(lambda: conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone() == ("SyncRep",), "the drainer waiting in SyncRep")
    # the slot's commit: no chunk under way
    assert conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND relation = 'accounts'::regclass",
                        (pid,)).fetchone() == (0,)
    conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
    outcome = drain.join()
    error = outcome.get("error")
    assert isinstance(error, errors.QueryCanceled), outcome
    assert error.diag.message_primary == "canceling statement due to user request"
    assert ("WARNING", "canceling wait for synchronous replication due to user request") in drain.messages
    assert drain.told_committed() == []
    assert job_state(conn, "synced") == ("pending", 0)
    assert conn.execute("SELECT failed_at FROM etc_batch.job_progress WHERE job_id = 'synced'").fetchone() == (None,)
    primary.link().mend()
    conn.execute("SELECT etc_batch.pace_job('synced', NULL)")
    assert conn.execute("CALL etc_batch.drain_job('synced')").fetchone()[-1] == "done"
    assert changes(conn) == {1: ITEMS}
    verify(conn, "synced")


def test_a_cancel_in_syncrep_then_a_failover_to_the_standby(primary, db):
    """Last of the module: the primary is lost after the cancel, the standby promoted. The
    chunk the cancel ended the wait of never reached it; every chunk the client was told
    of did; the job finishes there, each item once."""
    drain, chunk = cancel_in_syncrep(primary, db)
    lib_stop = pg_ctl_in("etcb-srv", primary.cluster.data_dir, primary.cluster.socket_dir / "server.log",
                         "-m", "immediate", "-w", "stop")
    assert lib_stop.returncode == 0
    standby = primary.standby
    pg_ctl_in(primary.link().ns, standby.data_dir, standby.socket_dir / "server.log", "-w", "promote")
    with standby.connect(db) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
        all_true(conn, drain.told_committed())
        status, committed = job_state(conn, "synced")
        assert status == "pending" and committed == (chunk - 1) * CHUNK
        assert changes(conn) == {1: committed, 0: ITEMS - committed}
        conn.execute("SELECT etc_batch.pace_job('synced', NULL)")
        assert conn.execute("CALL etc_batch.drain_job('synced')").fetchone()[-1] == "done"
        assert changes(conn) == {1: ITEMS}
        verify(conn, "synced")
        assert held_by_etc_batch(conn) == []
