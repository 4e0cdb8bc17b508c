"""Fixtures and helpers for the client-connection tests of etc_batch.

The cluster under test is the one libpq finds through PGHOST, PGPORT, PGUSER and
PGDATABASE (the test script exports them). Every test module works in a database of
its own, created here with the extension installed and dropped again at the end, so
modules never see each other's steps. Inside a module, every test uses batch names of
its own.

Connections are autocommit unless a test asks otherwise: exec_batch_from_id commits
after every step, which it can only do when CALLed outside a transaction block.
"""

import secrets
import sys
import threading
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.rows import dict_row  # noqa: E402

from support import (  # noqa: E402,F401
    WAIT, close_quietly, require_connection_env, wait_until,
)

# Upper bound for anything a test waits for (a backend to reach a point, a lock to be
# requested, a backend to exit). Generous, for slow machines; a test only ever waits
# this long when something is wrong.
# Upper bound for a whole CALL of the chain runner.
JOIN = 90.0




def _literal(value):
    return sql.Literal(value).as_string(None)


class Call:
    """CALL etc_batch.exec_batch_from_id(first, wait) in a thread of its own, on a
    connection of its own; keeps the notices the backend sent and the error it raised."""

    def __init__(self, db, first, wait=None, barrier=None, settings=()):
        self.conn = db.connect()
        for statement in settings:
            self.conn.execute(statement)
        self.pid = self.conn.info.backend_pid
        self.first = first
        self.notices = []
        self.conn.add_notice_handler(self._notice)
        self.error = None
        self.finished = threading.Event()
        self._barrier = barrier
        self._wait = wait
        self._thread = threading.Thread(
            target=self._run, name=f"exec_batch_from_id-{self.pid}", daemon=True
        )

    def _notice(self, diag):
        self.notices.append(diag.message_primary or "")

    def _run(self):
        try:
            if self._barrier is not None:
                self._barrier.wait(WAIT)
            call_chain(self.conn, self.first, self._wait)
        except BaseException as exc:  # kept for the test to assert on
            self.error = exc
        finally:
            self.finished.set()

    def start(self):
        self._thread.start()
        return self

    def join(self, timeout=JOIN):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), (
            f"CALL etc_batch.exec_batch_from_id({self.first}) in backend {self.pid} "
            f"has not returned after {timeout:.0f}s"
        )
        return self

    def check_running(self):
        """Fails the test at once if the CALL has already ended (with its error)."""
        if self.finished.is_set():
            raise AssertionError(
                f"CALL in backend {self.pid} ended early: {self.error!r}; notices {self.notices}"
            )


def call_chain(conn, first, wait=None):
    """CALL etc_batch.exec_batch_from_id on conn; wait=None leaves the default."""
    if wait is None:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
    else:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s, wait => %s)", (first, wait))


class Gate:
    """A barrier a step's command can block on: the gate holds a session advisory lock,
    and `command` waits for it with a transaction-scoped shared advisory lock (released
    when the step's transaction ends). open() lets every waiting step through."""

    def __init__(self, db):
        self.key = secrets.randbelow(2**31 - 1) + 1
        self.conn = db.connect()
        self.conn.execute("SELECT pg_advisory_lock(%s::bigint)", (self.key,))
        self.command = f"SELECT pg_advisory_xact_lock_shared({self.key}::bigint)"
        self.is_open = False

    def open(self):
        if not self.is_open:
            self.conn.execute("SELECT pg_advisory_unlock(%s::bigint)", (self.key,))
            self.is_open = True


class ChainDb:
    """A database of its own with etc_batch installed, plus the helper tables the step
    commands write to:

    side_effect  one row per executed step command (batch, step number within the
                 batch); pid and txid say which backend and which transaction ran it.
    knob         per batch: slow (steps that sleep do so only while it is true) and
                 divisor (steps that divide by it fail while it is 0).
    """

    def __init__(self, name):
        self.name = name
        self._conns = []
        self.admin = self.connect(row_factory=dict_row)
        self.admin.execute("CREATE EXTENSION etc_batch")
        self.admin.execute(
            """
            CREATE TABLE side_effect (
                batch  text    NOT NULL,
                step   integer NOT NULL,
                pid    integer NOT NULL DEFAULT pg_backend_pid(),
                txid   bigint  NOT NULL DEFAULT txid_current(),
                ran_as name    NOT NULL DEFAULT current_user
            )"""
        )
        self.admin.execute(
            """
            CREATE TABLE knob (
                batch   text    PRIMARY KEY,
                slow    boolean NOT NULL DEFAULT false,
                divisor integer NOT NULL DEFAULT 1
            )"""
        )

    # connections -------------------------------------------------------------------

    def connect(self, autocommit=True, **kwargs):
        kwargs.setdefault("connect_timeout", 10)
        conn = psycopg.connect(dbname=self.name, autocommit=autocommit, **kwargs)
        self._conns.append(conn)
        return conn

    def close_connections_since(self, mark):
        close_quietly(self._conns[mark:])
        del self._conns[mark:]

    def connection_mark(self):
        return len(self._conns)

    # building chains -----------------------------------------------------------------

    @staticmethod
    def new_batch(label):
        return f"{label}_{secrets.token_hex(4)}"

    @staticmethod
    def lit(value):
        return _literal(value)

    def side_command(self, batch, step, then=None):
        """A step command that records (batch, step) in side_effect, then runs `then`."""
        command = f"INSERT INTO side_effect(batch, step) VALUES ({self.lit(batch)}, {int(step)})"
        return command if then is None else f"{command}; {then}"

    def slow_clause(self, batch, seconds=30):
        """SQL that sleeps while knob.slow is true for batch."""
        return f"SELECT pg_sleep({seconds}) FROM knob WHERE batch = {self.lit(batch)} AND slow"

    def divide_clause(self, batch):
        """SQL that fails with division_by_zero while knob.divisor is 0 for batch."""
        return f"SELECT 1 / divisor FROM knob WHERE batch = {self.lit(batch)}"

    def set_knob(self, batch, **values):
        columns = ["batch", *values]
        self.admin.execute(
            sql.SQL(
                "INSERT INTO knob ({cols}) VALUES ({vals}) "
                "ON CONFLICT (batch) DO UPDATE SET ({cols}) = ROW({vals})"
            ).format(
                cols=sql.SQL(", ").join(map(sql.Identifier, columns)),
                vals=sql.SQL(", ").join(sql.Placeholder() * len(columns)),
            ),
            [batch, *values.values(), batch, *values.values()],
        )

    def add_steps(self, batch, commands, conn=None):
        """Adds the commands as consecutive steps of batch; returns their ids."""
        conn = conn or self.admin
        ids = []
        for command in commands:
            row = conn.execute(
                "SELECT etc_batch.add_step(%s, %s)", (batch, command)
            ).fetchone()
            ids.append(row["add_step"] if isinstance(row, dict) else row[0])
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        return ids

    def add_side_chain(self, batch, count, then=None):
        """A chain of `count` steps; step k records (batch, k) in side_effect."""
        return self.add_steps(
            batch, [self.side_command(batch, k, then) for k in range(1, count + 1)]
        )

    # running ---------------------------------------------------------------------------

    def call(self, first, wait=None, conn=None):
        """Runs the chain synchronously on a fresh connection (or conn); returns the
        notices it sent. Errors propagate."""
        conn = conn or self.connect()
        notices = []

        def keep(diag):
            notices.append(diag.message_primary or "")

        conn.add_notice_handler(keep)
        try:
            call_chain(conn, first, wait)
        finally:
            conn.remove_notice_handler(keep)
        return notices

    def start_call(self, first, wait=None, barrier=None, settings=()):
        return Call(self, first, wait=wait, barrier=barrier, settings=settings).start()

    def gate(self):
        return Gate(self)

    # observing -------------------------------------------------------------------------

    def side_counts(self, batch):
        rows = self.admin.execute(
            "SELECT step, count(*) AS n FROM side_effect WHERE batch = %s GROUP BY step",
            (batch,),
        ).fetchall()
        return {r["step"]: r["n"] for r in rows}

    def side_rows(self, batch):
        return self.admin.execute(
            "SELECT * FROM side_effect WHERE batch = %s ORDER BY step", (batch,)
        ).fetchall()

    def steps(self, batch):
        """batch_log rows of batch by id, with added_by as text."""
        rows = self.admin.execute(
            """SELECT id, batch, command, status, attempts, started_at, finished_at,
                      last_error, last_sqlstate, added_by::text AS added_by
                 FROM etc_batch.batch_log WHERE batch = %s ORDER BY id""",
            (batch,),
        ).fetchall()
        return {r["id"]: r for r in rows}

    def audit(self, batch):
        """step_audit rows of batch in audit order, with the roles as text."""
        return self.admin.execute(
            """SELECT audit_id, step_id, batch, attempt, pid, run_by::text AS run_by,
                      ran_as::text AS ran_as, lock_requested_at, lock_acquired_at,
                      status_seen, outcome, started_at, finished_at, error, sqlstate, txid
                 FROM etc_batch.step_audit WHERE batch = %s ORDER BY audit_id""",
            (batch,),
        ).fetchall()

    def activity(self, pid):
        return self.admin.execute(
            "SELECT state, wait_event_type, wait_event, query FROM pg_stat_activity WHERE pid = %s",
            (pid,),
        ).fetchone()

    def wait_for_pg_sleep(self, call):
        """Waits until call's backend is inside pg_sleep."""

        def sleeping():
            call.check_running()
            row = self.activity(call.pid)
            return row is not None and row["wait_event"] == "PgSleep"

        wait_until(sleeping, f"backend {call.pid} to sleep inside a step")

    def wait_for_gate(self, call, gate):
        """Waits until call's backend is blocked on gate, inside a step."""

        def blocked():
            call.check_running()
            return self.admin.execute(
                """SELECT EXISTS (SELECT FROM pg_locks
                                   WHERE pid = %s AND locktype = 'advisory'
                                     AND objid = %s::bigint::oid AND NOT granted)""",
                (call.pid, gate.key),
            ).fetchone()["exists"]

        wait_until(blocked, f"backend {call.pid} to wait on the gate inside a step")

    def wait_for_exit(self, pid):
        wait_until(lambda: self.activity(pid) is None, f"backend {pid} to exit")

    def holds_insert_lock(self, pid, table):
        return self.admin.execute(
            """SELECT EXISTS (SELECT FROM pg_locks
                               WHERE pid = %s AND relation = %s::regclass
                                 AND mode = 'RowExclusiveLock' AND granted)""",
            (pid, table),
        ).fetchone()["exists"]

    def assert_server_alive(self):
        """The module's first connection still works: no backend crashed (a crash
        makes the postmaster end every connection)."""
        assert self.admin.execute("SELECT 1 AS one").fetchone()["one"] == 1


@pytest.fixture(scope="module")
def db(request):
    """A fresh database with etc_batch installed, for the whole test module."""
    require_connection_env()
    module = request.module.__name__.rsplit(".", 1)[-1]
    name = f"etc_batch_it_{module}_{secrets.token_hex(4)}".lower()
    with psycopg.connect(autocommit=True, connect_timeout=10) as server:
        server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    chain_db = None
    try:
        chain_db = ChainDb(name)
        yield chain_db
    finally:
        if chain_db is not None:
            chain_db.close_connections_since(0)
        with psycopg.connect(autocommit=True, connect_timeout=10) as server:
            server.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(autouse=True)
def _close_test_connections(request):
    """Closes every connection a test opened, whatever the outcome of the test."""
    if "db" not in request.fixturenames:
        yield
        return
    chain_db = request.getfixturevalue("db")
    mark = chain_db.connection_mark()
    yield
    chain_db.close_connections_since(mark)


@pytest.fixture
def roles(db):
    """Creates roles with unique names for one test; drops them (and their privileges
    in the test database) afterwards. Call as roles("label") -> role name."""
    created = []

    def make(label, options="NOLOGIN"):
        name = f"{label}_{secrets.token_hex(3)}"
        db.admin.execute(sql.SQL("CREATE ROLE {} " + options).format(sql.Identifier(name)))
        created.append(name)
        return name

    yield make
    for name in reversed(created):
        db.admin.execute("RESET ROLE")
        db.admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        db.admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
