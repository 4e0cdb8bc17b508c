"""SQL one role wrote, run in another role's session, cannot leave anything behind in it.

A step runs as the role that added it and a job's change as the role that registered
it. When that is not the caller, it runs as a security-restricted operation, the way
VACUUM runs a table owner's index functions: no temporary table (searched before every
schema, so one planted with a trigger would run the author's code as the caller at the
caller's next unqualified INSERT), no cursor WITH HOLD, no LISTEN. Run by its own author,
the same SQL is not restricted.
"""

import secrets

import pytest
from psycopg import errors, sql

from test_jobs import Orders, drain, grant_job_api, make_handler, register

ADD_STEP = "etc_batch.add_step(text, text, bigint, boolean, interval, integer)"


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
    with pytest.raises(errors.InsufficientPrivilege,
                       match="cannot create temporary table within security-restricted operation"):
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
    clerk_conn = db.connect()
    clerk_conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(clerk)))
    handler = make_handler(db, orders, "CREATE TEMP TABLE IF NOT EXISTS planted (x int);",
                           conn=clerk_conn)
    keys = list(range(1, 6))
    job = db.new_batch("hrestricted")
    register(clerk_conn, job, orders.name, orders.items(keys), set_values=None, expect=None,
             handler=handler)

    # drained by another role (the superuser): restricted, the chunk rolls back
    superuser = db.connect()
    with pytest.raises(errors.InsufficientPrivilege,
                       match="cannot create temporary table within security-restricted operation"):
        drain(superuser, job)
    assert orders.snapshot() == orders.initial
    assert not temp_table_exists(superuser, "planted")

    # drained by the clerk who wrote the handler: not restricted, the job finishes
    assert drain(clerk_conn, job)["status"] == "done"


# the author's search_path ------------------------------------------------------------


def plant_now(db, tag):
    """evil_<tag>.now(): a look-alike of pg_catalog.now() that records being called and
    returns a date no clock would give, in a schema the caller puts first."""
    schema = f"evil_{tag}"
    db.admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    db.admin.execute(sql.SQL("CREATE TABLE {}.called (at text)").format(sql.Identifier(schema)))
    db.admin.execute(sql.SQL(
        "CREATE FUNCTION {s}.now() RETURNS timestamptz LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO {s}.called VALUES ('now'); RETURN '1999-01-01'; END $$"
    ).format(s=sql.Identifier(schema)))
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {s} TO PUBLIC; "
                             "GRANT INSERT ON {s}.called TO PUBLIC").format(s=sql.Identifier(schema)))
    return schema


def called(db, schema):
    return db.admin.execute(
        sql.SQL("SELECT count(*) AS n FROM {}.called").format(sql.Identifier(schema))
    ).fetchone()["n"]


def test_a_step_runs_with_its_authors_search_path_not_the_callers(db, roles):
    author = roles("author")
    grant_steps(db, author)
    tag = secrets.token_hex(3)
    evil = plant_now(db, tag)
    home = f"home_{tag}"
    db.admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
        sql.Identifier(home), sql.Identifier(author)))
    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(author)))
    conn.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(home)))
    conn.execute("CREATE TABLE loads (at timestamptz)")
    batch = db.new_batch("path")
    # unqualified on purpose: "loads" is found in the author's schema, now() in pg_catalog
    step = conn.execute("SELECT etc_batch.add_step(%s, 'INSERT INTO loads VALUES (now())') AS id",
                        (batch,)).fetchone()[0]
    conn.close()
    assert db.admin.execute("SELECT search_path FROM etc_batch.batch_log WHERE id = %s",
                            (step,)).fetchone()["search_path"] == f"{home}, public"

    runner = db.connect()
    runner.execute(sql.SQL("SET search_path = {}, public, pg_catalog").format(sql.Identifier(evil)))
    db.call(step, conn=runner)
    loaded = db.admin.execute(
        sql.SQL("SELECT at > now() - interval '1 hour' AS recent FROM {}.loads").format(sql.Identifier(home))
    ).fetchall()
    assert [r["recent"] for r in loaded] == [True]
    assert called(db, evil) == 0
    # and the caller's own setting is as it was
    assert runner.execute("SHOW search_path").fetchone()[0] == f"{evil}, public, pg_catalog"


def test_a_jobs_change_and_triggers_run_with_the_registrants_search_path(db, roles):
    clerk = roles("clerk")
    grant_job_api(db, clerk)
    tag = secrets.token_hex(3)
    evil = plant_now(db, tag)
    orders = Orders(db, "jpath", a_ids=range(1, 9))
    db.admin.execute(sql.SQL("ALTER TABLE {} ADD COLUMN changed_at timestamptz").format(orders.ident))
    db.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN NEW.changed_at := now(); RETURN NEW; END $$"
    ).format(fn=sql.Identifier(f"stamp_{tag}")))
    db.admin.execute(sql.SQL("CREATE TRIGGER stamp BEFORE UPDATE ON {t} FOR EACH ROW "
                             "EXECUTE FUNCTION {fn}()").format(t=orders.ident,
                                                              fn=sql.Identifier(f"stamp_{tag}")))
    db.admin.execute(sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(orders.ident, sql.Identifier(clerk)))
    keys = list(range(1, 9))
    job = db.new_batch("jpath")
    clerk_conn = db.connect()
    clerk_conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(clerk)))
    register(clerk_conn, job, orders.name, orders.items(keys))

    drainer = db.connect()
    drainer.execute(sql.SQL("SET search_path = {}, public, pg_catalog").format(sql.Identifier(evil)))
    assert drain(drainer, job)["status"] == "done"
    stamped = db.admin.execute(
        sql.SQL("SELECT bool_and(changed_at > now() - interval '1 hour') AS recent, count(*) AS n "
                "FROM {} WHERE changed_at IS NOT NULL").format(orders.ident)
    ).fetchone()
    assert stamped == {"recent": True, "n": len(keys)}
    assert called(db, evil) == 0
