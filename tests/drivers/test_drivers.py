"""The drivers orchestrators use, each straight to PostgreSQL and through PgBouncer in
transaction mode, with the settings docs/ways-of-calling.md gives for it:

  pgjdbc 42.5 (Debian's libpostgresql-jdbc-java, Java 17)
      escapeSyntaxCallMode=callIfNoReturn, so that {call ...} is sent as CALL; through
      the pooler also prepareThreshold=0 (PgBouncer's ignore_startup_parameters lists
      extra_float_digits, which pgjdbc sends at startup)
  node-postgres 8 (npm pg)        unnamed queries only
  asyncpg 0.32                    through the pooler, statement_cache_size=0
  psycopg2 2.9                    nothing to set

Each runs the same scenarios and prints what it got: a chain run; drain_job's five
results read the driver's own way (a CallableStatement's OUT parameters, asyncpg's
fetchrow, node's rows, a cursor); the same calls executed again and again, past any
threshold at which a driver would prepare them on the server; a failing step's
SQLSTATE; the 2D000 of a CALL with autocommit off; a lease acquired, a drain fenced by a
generation that is not the lease's (0B000), then drained under it.
"""

import asyncio
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT  # noqa: E402

HERE = Path(__file__).resolve().parent
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
NODE_MODULES = ROOT / "target" / "node" / "node_modules"
JAVA_BUILD = ROOT / "target" / "java"

# the pooler's settings of each driver (docs/ways-of-calling.md)
JDBC_POOLED = "&prepareThreshold=0"


def tag(label):
    return f"{label}_{secrets.token_hex(3)}"


class Objects:
    """What a driver's scenarios work on, made afresh for each run: a chain of two steps,
    a step that divides by zero, a 7-order job in chunks of 3, and a job and a lease for
    the fence."""

    def __init__(self, pg):
        a = pg.admin
        self.pg = pg
        self.batch = tag("drv_chain")
        a.execute("CREATE TABLE IF NOT EXISTS drv_side (batch text, step int)")
        self.chain = [a.execute("SELECT etc_batch.add_step(%s, %s)",
                                (self.batch, f"INSERT INTO drv_side VALUES ('{self.batch}', {n})")).fetchone()[0]
                      for n in (1, 2)]
        self.failing = a.execute("SELECT etc_batch.add_step(%s, 'SELECT 1 / 0')",
                                 (tag("drv_fail"),)).fetchone()[0]
        self.table = tag("drv_orders")
        a.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int NOT NULL DEFAULT 1, "
                          "status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))")
                  .format(sql.Identifier(self.table)))
        a.execute(sql.SQL("INSERT INTO {} (tenant, id) SELECT t, g FROM unnest(ARRAY['X', 'Y']) t, "
                          "generate_series(1, 7) g").format(sql.Identifier(self.table)))
        self.job, self.lease_job, self.lease = tag("drv_job"), tag("drv_leased"), tag("drv_lease")
        for job, tenant in ((self.job, "X"), (self.lease_job, "Y")):
            a.execute("SELECT etc_batch.register_job(%s, %s, %s::regclass, "
                      "(SELECT jsonb_agg(jsonb_build_object('id', g, 'revision', 1)) FROM generate_series(1, 7) g), "
                      "3, '{\"status\": \"cancelled\"}')", (job, tenant, self.table))

    def args(self):
        return [str(self.chain[0]), str(self.failing), self.job, self.lease_job, self.lease]

    def check(self, lines):
        """What every driver must have printed, and what the database must hold after."""
        got = {line[0]: line[1:] for line in (l.split("\t") for l in lines if l)}
        assert got["chain"] == ["ok"], got
        assert got["job"] == ["3", "7", "1", "7", "done"], got
        assert got["repeated"] == ["done/done"], got
        assert got["failure"][0] == "22012", got
        assert "division by zero" in got["failure"][1], got
        assert got["autocommit_off"] == ["2D000"], got
        assert got["fenced"] == ["0B000"], got
        assert got["leased"] == ["done"], got
        a = self.pg.admin
        assert a.execute("SELECT step, count(*) FROM drv_side WHERE batch = %s GROUP BY step ORDER BY step",
                         (self.batch,)).fetchall() == [(1, 1), (2, 1)]
        assert a.execute(sql.SQL("SELECT count(*) FILTER (WHERE status = 'cancelled' AND revision = 2) "
                                 "FROM {}").format(sql.Identifier(self.table))).fetchone() == (14,)
        assert a.execute("SELECT count(*), count(DISTINCT (job_id, position)) FROM etc_batch.job_audit "
                         "WHERE job_id IN (%s, %s)", (self.job, self.lease_job)).fetchone() == (14, 14)


def route(pg, bouncer, pooled):
    """(host, port) of the cluster, or of PgBouncer."""
    return ("127.0.0.1", bouncer.port) if pooled else ("127.0.0.1", int(os.environ["PGPORT"]))


def run(argv, **kwargs):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)
    assert done.returncode == 0, f"{argv[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def scenarios_class():
    JAVA_BUILD.mkdir(parents=True, exist_ok=True)
    run(["javac", "-d", str(JAVA_BUILD), "-cp", str(JDBC_JAR), str(HERE / "java" / "Scenarios.java")])
    return JAVA_BUILD


@pytest.fixture(params=["direct", "pgbouncer"])
def pooled(request):
    return request.param == "pgbouncer"


def test_pgjdbc(pg, bouncer, pooled, scenarios_class):
    objects = Objects(pg)
    host, port = route(pg, bouncer, pooled)
    url = (f"jdbc:postgresql://{host}:{port}/{pg.name}?user=postgres&escapeSyntaxCallMode=callIfNoReturn"
           + (JDBC_POOLED if pooled else ""))
    lines = run(["java", "-cp", f"{JDBC_JAR}:{scenarios_class}", "Scenarios", url, *objects.args()])
    objects.check(lines)


def test_node_postgres(pg, bouncer, pooled):
    objects = Objects(pg)
    host, port = route(pg, bouncer, pooled)
    lines = run(["node", str(HERE / "node" / "scenarios.js"), host, str(port), pg.name, *objects.args()],
                env={"NODE_PATH": str(NODE_MODULES), "PATH": "/usr/bin:/bin"})
    objects.check(lines)


async def asyncpg_scenarios(host, port, database, pooled, chain, failing, job, lease_job, lease):
    import asyncpg

    out = []
    # through a transaction-mode pooler, no statement cache: a cached statement is a
    # prepared statement on one server connection
    conn = await asyncpg.connect(host=host, port=port, user="postgres", database=database,
                                 **({"statement_cache_size": 0} if pooled else {}))
    try:
        await conn.execute("CALL etc_batch.exec_batch_from_id($1)", int(chain))
        out.append("chain\tok")

        async def drain(job, lease=None, holder=None, generation=None):
            return await conn.fetchrow("CALL etc_batch.drain_job($1, NULL, $2, $3, $4)",
                                       job, lease, holder, generation)

        d = await drain(job)
        out.append("\t".join(map(str, ["job", d["committed_chunks"], d["committed_items"],
                                       d["first_key"], d["last_key"], d["status"]])))
        status = None
        for _ in range(8):
            status = (await drain(job))["status"] + "/" + await conn.fetchval(
                "SELECT status FROM etc_batch.job_summary($1)", job)
        out.append(f"repeated\t{status}")
        try:
            await conn.execute("CALL etc_batch.exec_batch_from_id($1)", int(failing))
            out.append("failure\tnone")
        except asyncpg.PostgresError as e:
            out.append(f"failure\t{e.sqlstate}\t{e}")
        try:
            async with conn.transaction():
                await conn.execute("CALL etc_batch.exec_batch_from_id($1)", int(chain))
            out.append("autocommit_off\tnone")
        except asyncpg.PostgresError as e:
            out.append(f"autocommit_off\t{e.sqlstate}")
        generation = await conn.fetchval(
            "SELECT generation FROM etc_batch.acquire_lease($1, 'asyncpg', '1 hour')", lease)
        try:
            await drain(lease_job, lease, "asyncpg", generation + 1)
            out.append("fenced\tnone")
        except asyncpg.PostgresError as e:
            out.append(f"fenced\t{e.sqlstate}")
        out.append(f"leased\t{(await drain(lease_job, lease, 'asyncpg', generation))['status']}")
    finally:
        await conn.close()
    return out


def test_asyncpg(pg, bouncer, pooled):
    objects = Objects(pg)
    host, port = route(pg, bouncer, pooled)
    objects.check(asyncio.run(asyncpg_scenarios(host, port, pg.name, pooled, *objects.args())))


def psycopg2_scenarios(host, port, database, chain, failing, job, lease_job, lease):
    import psycopg2

    out = []
    conn = psycopg2.connect(host=host, port=port, user="postgres", dbname=database)
    try:
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("CALL etc_batch.exec_batch_from_id(%s)", (int(chain),))
        out.append("chain\tok")

        def drain(job, lease=None, holder=None, generation=None):
            cur.execute("CALL etc_batch.drain_job(%s, NULL, %s, %s, %s)", (job, lease, holder, generation))
            return cur.fetchone()

        d = drain(job)
        out.append("\t".join(map(str, ["job", *d])))
        status = None
        for _ in range(8):
            status = drain(job)[4]
            cur.execute("SELECT status FROM etc_batch.job_summary(%s)", (job,))
            status += "/" + cur.fetchone()[0]
        out.append(f"repeated\t{status}")
        try:
            cur.execute("CALL etc_batch.exec_batch_from_id(%s)", (int(failing),))
            out.append("failure\tnone")
        except psycopg2.Error as e:
            out.append(f"failure\t{e.pgcode}\t{e.pgerror.splitlines()[0].removeprefix('ERROR:  ')}")
        conn.autocommit = False  # psycopg2's default: BEGIN before the first statement
        try:
            cur.execute("CALL etc_batch.exec_batch_from_id(%s)", (int(chain),))
            out.append("autocommit_off\tnone")
        except psycopg2.Error as e:
            out.append(f"autocommit_off\t{e.pgcode}")
        conn.rollback()
        conn.autocommit = True
        cur.execute("SELECT generation FROM etc_batch.acquire_lease(%s, 'psycopg2', '1 hour')", (lease,))
        generation = cur.fetchone()[0]
        try:
            drain(lease_job, lease, "psycopg2", generation + 1)
            out.append("fenced\tnone")
        except psycopg2.Error as e:
            out.append(f"fenced\t{e.pgcode}")
        out.append(f"leased\t{drain(lease_job, lease, 'psycopg2', generation)[4]}")
    finally:
        conn.close()
    return out


def test_psycopg2(pg, bouncer, pooled):
    objects = Objects(pg)
    host, port = route(pg, bouncer, pooled)
    objects.check(psycopg2_scenarios(host, port, pg.name, *objects.args()))


# what each setting is for: the defaults, through the pooler ------------------------------


def test_the_defaults_break_behind_a_transaction_mode_pooler(pg, bouncer, scenarios_class):
    """Without the settings above, through PgBouncer in transaction mode: pgjdbc's
    statement prepared on the server from its fifth execution, node-postgres' named
    query meet a server connection that holds another client's prepared statement of
    the same name (42P05); asyncpg's cached statement, once another client's
    transaction holds the server connection it was prepared on, runs on one that lacks
    it (26000)."""
    objects = Objects(pg)
    host, port = route(pg, bouncer, pooled=True)
    url = f"jdbc:postgresql://{host}:{port}/{pg.name}?user=postgres"
    # two clients, one after the other, share the server connection the pooler hands
    # out most recently used first
    jdbc = [run(["java", "-cp", f"{JDBC_JAR}:{scenarios_class}", "Scenarios", url, "repeat", objects.job])
            for _ in range(2)]
    assert jdbc[1] == ["repeat\t42P05"], jdbc
    # and straight to the server too, {call ...} without escapeSyntaxCallMode is a SELECT
    direct = f"jdbc:postgresql://127.0.0.1:{os.environ['PGPORT']}/{pg.name}?user=postgres"
    escape = run(["java", "-cp", f"{JDBC_JAR}:{scenarios_class}", "Scenarios", direct, "escape", objects.job])
    assert escape == ["escape\t42809"], escape
    node = [run(["node", str(HERE / "node" / "scenarios.js"), host, str(port), pg.name, "named", "", objects.job],
                env={"NODE_PATH": str(NODE_MODULES), "PATH": "/usr/bin:/bin"}) for _ in range(2)]
    assert node[1] == ["named\t42P05"], node

    async def cached_statement_moved_to_another_server():
        import asyncpg

        conn = await asyncpg.connect(host=host, port=port, user="postgres", database=pg.name)
        # another client's open transaction takes the server connection this one used
        other = bouncer.connect(pg.name, autocommit=False)
        try:
            await conn.fetchval("SELECT status FROM etc_batch.job_summary($1)", objects.job)
            other.execute("SELECT 1")
            await conn.fetchval("SELECT status FROM etc_batch.job_summary($1)", objects.job)
            return "ok"
        except asyncpg.PostgresError as e:
            return e.sqlstate
        finally:
            other.rollback()
            other.close()
            await conn.close()

    assert asyncio.run(cached_statement_moved_to_another_server()) == "26000"
