"""SQL one role wrote, run in another role's session, cannot leave anything behind in it.

A step runs as the role that added it and a job's change as the role that registered
it. When that is not the caller, it runs as a security-restricted operation, the way
VACUUM runs a table owner's index functions: no temporary table (searched before every
schema, so one planted with a trigger would run the author's code as the caller at the
caller's next unqualified INSERT), no cursor WITH HOLD, no LISTEN. Run by its own author,
the same SQL is not restricted.
"""

import secrets

import psycopg
import pytest
from psycopg import errors, sql

from test_jobs import Orders, drain, grant_job_api, register

ADD_STEP = "etc_batch.add_step(text, text, bigint)"


def grant_steps(db, role):
    r = sql.Identifier(role)
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(r))
    db.admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION " + ADD_STEP + " TO {}").format(r))
    db.admin.execute(sql.SQL("GRANT CREATE, TEMPORARY ON DATABASE {} TO {}").format(
        sql.Identifier(db.name), r))


def add_step_as(db, role, batch, command):
    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    step = conn.execute("SELECT etc_batch.add_step(%s, %s) AS id", (batch, command)).fetchone()
    conn.close()
    return step["id"] if isinstance(step, dict) else step[0]


def temp_table_exists(conn, name):
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL AS e", (f"pg_temp.{name}",)).fetchone()
    return row["e"] if isinstance(row, dict) else row[0]


@pytest.mark.parametrize(
    "command, refused",
    [
        ("CREATE TEMP TABLE {name} (x int)", "cannot create temporary table within security-restricted operation"),
        ("LISTEN {name}", "cannot execute LISTEN within security-restricted operation"),
        ("DECLARE {name} CURSOR WITH HOLD FOR SELECT 1", "cannot create a cursor WITH HOLD within security-restricted operation"),
    ],
    ids=["temp table", "listen", "cursor with hold"],
)
def test_another_roles_step_cannot_leave_session_state(db, roles, command, refused):
    author = roles("author")
    grant_steps(db, author)
    name = f"planted_{secrets.token_hex(3)}"
    batch = db.new_batch("restricted")
    step = add_step_as(db, author, batch, command.format(name=name))

    runner = db.connect()
    with pytest.raises(errors.InsufficientPrivilege) as failed:
        db.call(step, conn=runner)
    assert refused in str(failed.value)
    assert failed.value.sqlstate == "42501"
    # the failure is the step's, recorded and committed like any other
    assert db.admin.execute(
        "SELECT status, last_sqlstate FROM etc_batch.batch_log WHERE id = %s", (step,)
    ).fetchone() == {"status": "failed", "last_sqlstate": "42501"}
    assert not temp_table_exists(runner, name)
    runner.execute("SELECT 1")  # the session is intact


def test_a_step_run_by_its_own_author_is_not_restricted(db, roles):
    author = roles("author", "NOLOGIN")
    grant_steps(db, author)
    db.admin.execute(
        sql.SQL("GRANT EXECUTE ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean, text, text, bigint) TO {}")
        .format(sql.Identifier(author)))
    name = f"staging_{secrets.token_hex(3)}"
    batch = db.new_batch("own")
    first = add_step_as(db, author, batch, f"CREATE TEMP TABLE {name} (x int)")
    add_step_as(db, author, batch, f"INSERT INTO {name} VALUES (1)")

    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(author)))
    db.call(first, conn=conn)
    # a temporary table a step made stays for the author's next steps, in the author's session
    assert conn.execute(f"SELECT count(*) FROM pg_temp.{name}").fetchone()[0] == 1


def test_a_planted_temp_table_with_a_trigger_never_reaches_the_caller(db, roles):
    """The attack the restriction exists for: a step that plants pg_temp.orders with a
    trigger, so that the caller's next unqualified INSERT INTO orders runs the author's
    function with the caller's privileges."""
    author = roles("author")
    grant_steps(db, author)
    db.admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(author)))
    db.admin.execute("CREATE TABLE IF NOT EXISTS public.orders_target (id int)")
    tag = secrets.token_hex(3)
    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(author)))
    conn.execute(sql.SQL(
        "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN ALTER ROLE {} SUPERUSER; RETURN NEW; END $$"
    ).format(sql.Identifier(f"escalate_{tag}"), sql.Identifier(author)))
    conn.close()
    batch = db.new_batch("plant")
    step = add_step_as(
        db, author, batch,
        f"CREATE TEMP TABLE orders_target (id int); "
        f"CREATE TRIGGER t BEFORE INSERT ON pg_temp.orders_target FOR EACH ROW "
        f"EXECUTE FUNCTION public.escalate_{tag}()",
    )
    superuser = db.connect()
    with pytest.raises(errors.InsufficientPrivilege):
        db.call(step, conn=superuser)
    superuser.execute("INSERT INTO orders_target VALUES (1)")
    assert db.admin.execute(
        "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (author,)
    ).fetchone()["rolsuper"] is False
    assert db.admin.execute("SELECT count(*) AS n FROM public.orders_target").fetchone()["n"] >= 1


def test_a_handler_of_another_role_is_restricted_too(db, roles):
    clerk = roles("clerk")
    grant_job_api(db, clerk)
    orders = Orders(db, "hrestricted", a_ids=range(1, 12))
    db.admin.execute(sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(
        orders.ident, sql.Identifier(clerk)))
    db.admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(clerk)))
    db.admin.execute(sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
        sql.Identifier(db.name), sql.Identifier(clerk)))
    fn = f"plant_{secrets.token_hex(3)}"
    clerk_conn = db.connect()
    clerk_conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(clerk)))
    clerk_conn.execute(sql.SQL(
        """CREATE FUNCTION {fn}(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
           DECLARE r jsonb;
           BEGIN
             CREATE TEMP TABLE IF NOT EXISTS planted (x int);
             UPDATE {t} SET status = 'cancelled', revision = revision + 1
              WHERE tenant = item->>'tenant' AND id = (item->>'id')::int
                AND revision = (item->>'revision')::int
             RETURNING to_jsonb({t}.*) INTO r;
             RETURN r;
           END $$"""
    ).format(fn=sql.Identifier(fn), t=orders.ident))
    keys = list(range(1, 6))
    job = db.new_batch("hrestricted")
    register(clerk_conn, job, orders.name, orders.items(keys), set_values=None, expect=None,
             handler=f"{fn}(jsonb)")

    # drained by another role (the superuser): restricted, the chunk rolls back
    superuser = db.connect()
    with pytest.raises(errors.InsufficientPrivilege):
        drain(superuser, job)
    assert orders.snapshot() == orders.initial
    assert not temp_table_exists(superuser, "planted")

    # drained by the clerk who wrote the handler: not restricted, the job finishes
    assert drain(clerk_conn, job)["status"] == "done"
