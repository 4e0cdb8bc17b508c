"""The work the fault tests do and the facts they check afterwards: a table of accounts
whose every committed change a trigger logs, jobs over it, chains whose steps record
that they ran, and what a session that is gone must not hold."""

from psycopg import sql

WIDE = "x" * 120


def make_accounts(conn, items, tablespace=None):
    """accounts (no revision column: the row digest guards it) and a log, in the default
    tablespace, of every update a trigger sees: each id's count is how many times the
    row was changed by a transaction that committed."""
    where = sql.SQL(" TABLESPACE {}").format(sql.Identifier(tablespace)) if tablespace else sql.SQL("")
    conn.execute(sql.SQL("CREATE TABLE accounts (id bigint PRIMARY KEY, note text NOT NULL){}").format(where))
    conn.execute("INSERT INTO accounts SELECT g, 'n' FROM generate_series(1, %s) g", (items,))
    conn.execute("CREATE TABLE accounts_log (id bigint NOT NULL, txid bigint NOT NULL)")
    conn.execute("""CREATE FUNCTION log_update() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN INSERT INTO accounts_log VALUES (NEW.id, txid_current()); RETURN NEW; END $$""")
    conn.execute("CREATE TRIGGER log_update AFTER UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION log_update()")


def register(conn, job, items, chunk, parallel=False):
    """A job setting every account's note to WIDE."""
    row = conn.execute(
        "SELECT job_id, created, items, chunks FROM etc_batch.register_job("
        "%s, NULL, 'accounts'::regclass, "
        "(SELECT jsonb_agg(jsonb_build_object('id', g) ORDER BY g) FROM generate_series(1, %s) g), "
        "%s, jsonb_build_object('note', %s::text), tenant_column => NULL, revision_column => NULL, "
        "parallel => %s)",
        (job, items, chunk, WIDE, parallel),
    ).fetchone()
    assert row == (job, True, items, -(-items // chunk))


def changes(conn):
    """{times changed: number of rows}, from the trigger's log, over every account."""
    return dict(conn.execute(
        "SELECT times, count(*) FROM (SELECT a.id, count(l.id) AS times FROM accounts a "
        "LEFT JOIN accounts_log l USING (id) GROUP BY a.id) t GROUP BY times").fetchall())


def job_state(conn, job):
    """The job's status and how many of its items the audit has as committed."""
    status = conn.execute("SELECT status FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()[0]
    audited = conn.execute(
        "SELECT count(*) FROM etc_batch.job_report(%s) WHERE state = 'matching'", (job,)).fetchone()[0]
    return status, audited


def verify(conn, job):
    """verify_job ran its checks on the job, and every one of them passed."""
    checks = conn.execute("SELECT check_name, ok, detail FROM etc_batch.verify_job(%s)", (job,)).fetchall()
    assert checks, f"verify_job checked nothing of job {job}"
    failed = [(name, detail) for name, ok, detail in checks if not ok]
    assert failed == []


def held_by_etc_batch(conn):
    """etc_batch's session locks (its advisory key spaces, objsubid 3 and up) held by any
    backend, and the jobs that count a drainer: what a session that is gone must not
    leave behind."""
    locks = conn.execute(
        "SELECT pid, objsubid FROM pg_locks WHERE locktype = 'advisory' AND objsubid >= 3 "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").fetchall()
    drained = conn.execute("SELECT job_id, drainer_pids FROM etc_batch.job_progress WHERE drainers > 0").fetchall()
    return locks + drained
