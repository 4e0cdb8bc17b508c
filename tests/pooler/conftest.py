"""Fixtures for running etc_batch behind a real PgBouncer in transaction pooling mode.

PostgreSQL is the cluster libpq finds through PGHOST, PGPORT, PGUSER and PGDATABASE
(the test script exports them); it also listens on 127.0.0.1:PGPORT with trust
authentication, which is where PgBouncer connects. The module gets:

  pg        a database of its own on PostgreSQL, with etc_batch installed, dropped WITH
            (FORCE) at the end; `pg.direct()` connects to it without the pooler.
  bouncer   a PgBouncer (transaction pooling, default_pool_size = 3) in front of that
            cluster, listening on 127.0.0.1 only, terminated at the end;
            `bouncer.connect(dbname)` connects through it.
  app_role  a LOGIN role with a unique name, known to PgBouncer's auth_file, dropped
            at the end.
  workers   starts worker processes and makes sure every one is joined or killed.

PgBouncer refuses to run as root: when the tests run as root it runs as the postgres
OS user, with its configuration, log and pid file in target/pgbouncer/.
"""

import multiprocessing
import multiprocessing.connection
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import (  # noqa: E402,F401
    WAIT, close_quietly, require_connection_env, wait_until,
)
import pytest
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
BOUNCER_DIR = ROOT / "target" / "pgbouncer"
PGBOUNCER = "/usr/sbin/pgbouncer"
PG_OS_USER = "postgres"
POOL_SIZE = 3

# Upper bound for anything a test waits for; only ever reached when something is wrong.

# The application role of this run: PgBouncer's auth_file is written before the role
# exists, so its name is fixed when this file is imported.
APP_ROLE = f"etc_batch_app_{secrets.token_hex(4)}"




def pg_port():
    return int(os.environ["PGPORT"])


def connect_direct(dbname, user="postgres", **kwargs):
    """A connection straight to PostgreSQL (TCP on 127.0.0.1), autocommit by default."""
    kwargs.setdefault("autocommit", True)
    kwargs.setdefault("connect_timeout", 10)
    return psycopg.connect(host="127.0.0.1", port=pg_port(), dbname=dbname, user=user, **kwargs)


def connect_bouncer(port, dbname, user="postgres", **kwargs):
    """A connection through PgBouncer. Autocommit, and no server-side prepared
    statements: psycopg prepares a statement after it ran five times, and PgBouncer
    1.18 in transaction mode cannot follow a prepared statement from one server
    connection to the next."""
    kwargs.setdefault("autocommit", True)
    kwargs.setdefault("connect_timeout", 10)
    return psycopg.connect(
        host="127.0.0.1", port=port, dbname=dbname, user=user, prepare_threshold=None, **kwargs
    )


def _free_port(preferred=55450):
    """preferred if nothing listens there on 127.0.0.1, else one the kernel picks."""
    for candidate in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free TCP port on 127.0.0.1")


# PostgreSQL ------------------------------------------------------------------------------


class PgDb:
    """The module's database on PostgreSQL, reached directly."""

    def __init__(self, name):
        self.name = name
        self._conns = []
        self.admin = self.direct()

    def direct(self, user="postgres", **kwargs):
        conn = connect_direct(self.name, user=user, **kwargs)
        self._conns.append(conn)
        return conn

    def close_all(self):
        close_quietly(self._conns)
        self._conns.clear()


@pytest.fixture(scope="module")
def pg(request):
    """A fresh database with etc_batch installed, for the whole test module."""
    require_connection_env()
    module = request.module.__name__.rsplit(".", 1)[-1]
    name = f"etc_batch_pool_{module}_{secrets.token_hex(4)}".lower()
    with connect_direct(os.environ.get("PGDATABASE", "postgres")) as server:
        server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    db = None
    try:
        db = PgDb(name)
        db.admin.execute("CREATE EXTENSION etc_batch")
        yield db
    finally:
        if db is not None:
            db.close_all()
        with connect_direct(os.environ.get("PGDATABASE", "postgres")) as server:
            server.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="module")
def app_role(pg):
    """LOGIN role APP_ROLE (cluster-wide), dropped with its privileges at the end."""
    ident = sql.Identifier(APP_ROLE)
    pg.admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    try:
        yield APP_ROLE
    finally:
        with connect_direct(pg.name) as conn:
            # its server connections first: PgBouncer may still hold some
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (APP_ROLE,),
            )
            conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            conn.execute(sql.SQL("DROP ROLE {}").format(ident))


# PgBouncer -------------------------------------------------------------------------------


class Bouncer:
    def __init__(self, port, directory, proc):
        self.port = port
        self.dir = directory
        self.proc = proc
        self._conns = []

    def connect(self, dbname, user="postgres", **kwargs):
        conn = connect_bouncer(self.port, dbname, user=user, **kwargs)
        self._conns.append(conn)
        return conn

    def admin(self, command):
        """Runs a command on PgBouncer's admin console (simple query protocol only,
        hence psql); returns its output."""
        done = subprocess.run(
            ["psql", "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", "pgbouncer", "-c", command],
            capture_output=True, text=True, timeout=WAIT,
            env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
        )
        assert done.returncode == 0, f"pgbouncer admin {command!r}: {done.stderr}"
        return done.stdout

    def log(self):
        try:
            return (self.dir / "pgbouncer.log").read_text()
        except OSError:
            return ""

    def close_connections(self):
        close_quietly(self._conns)
        self._conns.clear()


def _write_config(directory, port):
    (directory / "users.txt").write_text(f'"postgres" ""\n"{APP_ROLE}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        f"""[databases]
* = host=127.0.0.1 port={pg_port()}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,options
admin_users = postgres
logfile = {directory / "pgbouncer.log"}
pidfile = {directory / "pgbouncer.pid"}
"""
    )


def _stop(proc):
    if proc.poll() is not None:
        return
    proc.terminate()  # SIGTERM to the pid started here
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class PortTaken(Exception):
    """PgBouncer could not listen on its port: something took it after it was found free."""


@pytest.fixture(scope="module")
def bouncer(pg):
    """PgBouncer in transaction mode in front of the cluster under test.

    A port found free can be taken before PgBouncer binds it, by another program or as
    the source port of an outgoing connection (the test ports lie in Linux's ephemeral
    range); PgBouncer then says so and exits, and is started again on a port the kernel
    picks."""
    if os.path.exists(PGBOUNCER):
        binary = PGBOUNCER
    else:
        binary = shutil.which("pgbouncer")
    if binary is None:
        pytest.fail(f"{PGBOUNCER} not found (install the pgbouncer package)", pytrace=False)
    BOUNCER_DIR.mkdir(parents=True, exist_ok=True)
    for preferred in (55450, 0, 0):
        b = _start_bouncer(binary, pg, _free_port(preferred))
        if b is not None:
            break
    else:
        pytest.fail("pgbouncer found no port to listen on, three times", pytrace=False)
    try:
        yield b
    finally:
        b.close_connections()
        _stop(b.proc)


def _start_bouncer(binary, pg, port):
    """PgBouncer on `port`, accepting connections; None when the port was taken."""
    for leftover in ("pgbouncer.pid", "pgbouncer.log", "stderr.log"):
        (BOUNCER_DIR / leftover).unlink(missing_ok=True)
    _write_config(BOUNCER_DIR, port)

    popen_user = {}
    if os.geteuid() == 0:
        # PgBouncer refuses root: run it as postgres, owning its directory.
        pw = pwd.getpwnam(PG_OS_USER)
        for path in [BOUNCER_DIR, *BOUNCER_DIR.iterdir()]:
            os.chown(path, pw.pw_uid, pw.pw_gid)
        popen_user = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    with open(BOUNCER_DIR / "stderr.log", "wb") as stderr:
        proc = subprocess.Popen(
            [binary, str(BOUNCER_DIR / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=BOUNCER_DIR,
            **popen_user,
        )
    b = Bouncer(port, BOUNCER_DIR, proc)

    def accepting():
        if proc.poll() is not None:
            said = b.log() + (BOUNCER_DIR / "stderr.log").read_text()
            if "Address already in use" in said:
                raise PortTaken(said)
            raise AssertionError(f"pgbouncer exited with {proc.returncode}: {said}")
        try:
            with connect_bouncer(port, pg.name, connect_timeout=2) as conn:
                return conn.execute("SELECT 1").fetchone()[0] == 1
        except psycopg.OperationalError:
            return False

    try:
        wait_until(accepting, f"pgbouncer to accept connections on 127.0.0.1:{port}")
    except PortTaken:
        return None
    except BaseException:
        b.close_connections()
        _stop(proc)
        raise
    return b


@pytest.fixture(autouse=True)
def _close_bouncer_connections(request):
    """Closes every pooled connection a test opened, whatever its outcome."""
    yield
    if "bouncer" in request.fixturenames:
        request.getfixturevalue("bouncer").close_connections()


# worker processes --------------------------------------------------------------------------


class Workers:
    """Worker processes started by one test (spawned: each opens its own connections).

    Each worker reports through a pipe of its own, never through a shared queue or
    lock: a worker the test kills with SIGKILL could otherwise die holding a lock the
    others need."""

    def __init__(self):
        self.ctx = multiprocessing.get_context("spawn")
        self.procs = []
        self._readers = {}

    def start(self, target, args_for):
        """Starts one process per element of args_for, calling target(*args, out) where
        out is the write end of the worker's pipe; returns the processes."""
        started = []
        for args in args_for:
            reader, writer = self.ctx.Pipe(duplex=False)
            index = len(self.procs)
            p = self.ctx.Process(
                target=target, args=(*args, writer), name=f"worker-{index}", daemon=True
            )
            p.start()
            writer.close()  # the child has its own copy: EOF once the child is gone
            self._readers[reader] = index
            self.procs.append(p)
            started.append(p)
        return started

    def recv(self, timeout):
        """The next message any worker sent, as (worker index, message); None when
        none came within timeout seconds or every worker has gone."""
        deadline = time.monotonic() + timeout
        while self._readers:
            ready = multiprocessing.connection.wait(
                list(self._readers), max(0.0, deadline - time.monotonic())
            )
            if not ready:
                return None
            for reader in ready:
                try:
                    return self._readers[reader], reader.recv()
                except (EOFError, OSError):
                    del self._readers[reader]
                    reader.close()
        return None

    def join_all(self, timeout):
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [p.name for p in self.procs if p.is_alive()]
        assert not alive, f"worker processes still running after {timeout:.0f}s: {alive}"

    def shutdown(self):
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(5)
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
        for reader in self._readers:
            reader.close()
        self._readers.clear()


@pytest.fixture
def workers():
    w = Workers()
    try:
        yield w
    finally:
        w.shutdown()
