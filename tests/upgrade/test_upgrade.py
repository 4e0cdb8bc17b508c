"""Upgrades and backups: nothing etc_batch keeps is lost, and everything still works.

- Every released version's install script is kept, frozen, in sql/released/ (checked
  against sql/released/SHA256SUMS), and has an update path to the version built now.
- For each released version, as its users would: build and install that version's
  library and script from the commit sql/released/SOURCES names, create chains, jobs
  and leases in every state they can be in, install the current build, see etc_batch
  refuse to work until the update, ALTER EXTENSION etc_batch UPDATE, and check that every
  row survived, that the catalog is exactly what a fresh CREATE EXTENSION makes, and that
  the work carries on where it stopped.
- pg_dump and pg_restore of a database using etc_batch keep chains, jobs, audit and
  leases, and the restored database carries on too.

The cluster is the one libpq finds through PGHOST, PGPORT and PGUSER; every test works
in databases of its own.
"""

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT, lib, pg_bin  # noqa: E402

RELEASED = ROOT / "sql" / "released"
PG_BIN = pg_bin()



def released_versions():
    return sorted(
        (p.name[len("etc_batch--"):-len(".sql")] for p in RELEASED.glob("etc_batch--*.sql")
         if p.name.count("--") == 1),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )


def connect(db, **kw):
    kw.setdefault("autocommit", True)
    kw.setdefault("row_factory", dict_row)
    conn = psycopg.connect(dbname=db, **kw)
    conn.add_notice_handler(lambda d: None)
    return conn


def fresh_database(name):
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')


def drop_database(name):
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def current_version():
    with connect("postgres") as c:
        return c.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'etc_batch'"
        ).fetchone()["default_version"]


# -- the state every test builds -----------------------------------------------------

ITEMS = 30


def build_state(c):
    """Chains, jobs and leases in the states they can be in: a chain stopped at a failed
    step, a job half drained, one untouched, one aborted, a lease held and one released."""
    c.execute(
        "CREATE TABLE public.orders (tenant text, id integer, revision bigint NOT NULL DEFAULT 1, "
        "qty integer NOT NULL, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))"
    )
    c.execute(
        "INSERT INTO public.orders (tenant, id, qty) "
        "SELECT t, g, 1 + g %% 4 FROM unnest(ARRAY['A', 'B']) t, generate_series(1, %s) g",
        (ITEMS,),
    )
    for job, first, last in (("half", 1, 20), ("untouched", 21, 25), ("stopped", 26, 30)):
        c.execute(
            "SELECT etc_batch.register_job(%s, 'A', 'public.orders', "
            "(SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty)) "
            "   FROM public.orders WHERE tenant = 'A' AND id BETWEEN %s AND %s), 4, "
            "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}')",
            (job, first, last),
        )
    c.execute("CALL etc_batch.drain_job('half', 2)")
    c.execute("SELECT etc_batch.abort_job('stopped', 'changed our minds')")
    # a handler job, half drained: its handler is kept by name from 0.4.0 on
    c.execute("CREATE TABLE public.handled (tenant text, id integer, revision bigint NOT NULL DEFAULT 1, "
              "status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))")
    c.execute("INSERT INTO public.handled (tenant, id) SELECT 'H', g FROM generate_series(1, 4) g")
    c.execute("CREATE FUNCTION public.cancel_handled(item jsonb) RETURNS jsonb LANGUAGE sql AS $$ "
              "UPDATE public.handled SET status = 'cancelled', revision = revision + 1 "
              "WHERE tenant = item->>'tenant' AND id = (item->>'id')::int "
              "AND revision = (item->>'revision')::int RETURNING to_jsonb(handled.*) $$")
    c.execute("SELECT etc_batch.register_job('handled', 'H', 'public.handled', "
              "'[{\"id\": 1, \"revision\": 1}, {\"id\": 2, \"revision\": 1}, "
              "{\"id\": 3, \"revision\": 1}, {\"id\": 4, \"revision\": 1}]', 2, NULL, "
              "handler => 'public.cancel_handled(jsonb)')")
    c.execute("CALL etc_batch.drain_job('handled', 1)")

    c.execute("CREATE TABLE public.loaded (step bigint PRIMARY KEY)")
    c.execute("CREATE TABLE public.knob (ok boolean)")
    c.execute("INSERT INTO public.knob VALUES (false)")
    for step in range(1, 6):
        # step 3 divides by zero until the knob is turned
        command = (
            "INSERT INTO public.loaded SELECT 3 / ok::int FROM public.knob"
            if step == 3
            else f"INSERT INTO public.loaded VALUES ({step})"
        )
        c.execute("SELECT etc_batch.add_step('nightly', %s, %s)", (command, step))
    with pytest.raises(psycopg.errors.DivisionByZero):
        c.execute("CALL etc_batch.exec_batch_from_id(1)")

    c.execute("SELECT * FROM etc_batch.acquire_lease('leader', 'w1', '1 hour')")
    c.execute("SELECT * FROM etc_batch.acquire_lease('former', 'w2', '1 hour')")
    c.execute("SELECT etc_batch.release_lease('former', 'w2')")


TABLES = ("batch_log", "step_audit", "job", "job_item", "job_audit", "lease")


def snapshot(c):
    """Every row etc_batch keeps, as JSON, in a stable order."""
    out = {}
    for t in TABLES:
        out[t] = [
            r["row"]
            for r in c.execute(
                f"SELECT to_jsonb(t) AS row FROM etc_batch.{t} t ORDER BY to_jsonb(t)::text"
            ).fetchall()
        ]
    out["orders"] = [
        r["row"] for r in c.execute(
            "SELECT to_jsonb(o) AS row FROM public.orders o ORDER BY tenant, id"
        ).fetchall()
    ]
    out["loaded"] = [r["step"] for r in c.execute("SELECT step FROM public.loaded ORDER BY step")]
    return out


def assert_state_built(s):
    """The snapshot holds what build_state made, so that comparing two of them means
    something."""
    status = {r["job_id"]: (r["status"], r["next_index"]) for r in s["job"]}
    assert status == {"half": ("pending", 8), "untouched": ("pending", 0), "stopped": ("aborted", 0),
                      "handled": ("pending", 2)}
    assert len(s["job_item"]) == ITEMS + 4 and len(s["job_audit"]) == 8 + 2
    assert {r["id"]: r["status"] for r in s["batch_log"]} == {
        1: "done", 2: "done", 3: "failed", 4: "pending", 5: "pending"}
    assert s["loaded"] == [1, 2]
    assert {r["name"]: (r["holder"], r["generation"]) for r in s["lease"]} == {
        "leader": ("w1", 1), "former": ("w2", 1)}


def carry_on(c):
    """The work goes on from where it stopped, exactly once."""
    verified = c.execute("SELECT bool_and(ok) AS ok FROM etc_batch.verify_job('half')").fetchone()
    assert verified["ok"] is True
    c.execute("CALL etc_batch.drain_job('half')")
    c.execute("CALL etc_batch.drain_job('untouched')")
    summary = c.execute(
        "SELECT job_id, s.* FROM unnest(ARRAY['half', 'untouched']) job_id, "
        "LATERAL etc_batch.job_summary(job_id) s ORDER BY job_id"
    ).fetchall()
    assert [(r["job_id"], r["status"], r["committed"], r["matching"]) for r in summary] == [
        ("half", "done", 20, 20), ("untouched", "done", 5, 5)]
    changed = c.execute(
        "SELECT count(*) FILTER (WHERE status = 'cancelled' AND revision = 2) AS once, "
        "count(*) FILTER (WHERE revision > 2) AS twice, "
        "count(*) FILTER (WHERE tenant = 'B' AND (status <> 'pending' OR revision <> 1)) AS other "
        "FROM public.orders"
    ).fetchone()
    assert changed == {"once": 25, "twice": 0, "other": 0}
    audit = c.execute(
        "SELECT count(*) AS n, count(DISTINCT (job_id, position)) AS distinct_items "
        "FROM etc_batch.job_audit"
    ).fetchone()
    assert audit == {"n": 25 + 2, "distinct_items": 25 + 2}
    # the handler job goes on with its handler, found by its name
    c.execute("CALL etc_batch.drain_job('handled')")
    assert c.execute("SELECT count(*) AS n FROM public.handled WHERE status = 'cancelled' AND revision = 2"
                     ).fetchone()["n"] == 4
    assert c.execute("SELECT bool_and(ok) AS ok FROM etc_batch.verify_job('handled')").fetchone()["ok"] is True
    # a job made before the update, reverted after it: each row expected at the revision
    # its audit says the change left it at, and set back to what the job's expect says it
    # held; order 7, changed by the application since, is left out and named
    c.execute("UPDATE public.orders SET qty = qty + 10, revision = revision + 1 WHERE tenant = 'A' AND id = 7")
    preview = c.execute(
        "SELECT items, drifted, gone, another_tenant, set_back FROM etc_batch.revert_preview('half')").fetchone()
    assert preview == {"items": 19, "drifted": 1, "gone": 0, "another_tenant": 0,
                       "set_back": {"status": "pending"}}
    left_out = c.execute("SELECT item_key, state FROM etc_batch.revert_preview_left_out('half')").fetchall()
    assert left_out == [{"item_key": "7", "state": "drifted"}]
    c.execute("SELECT etc_batch.register_revert('half', 'half-reverted')")
    reverted = c.execute("CALL etc_batch.drain_job('half-reverted')").fetchone()
    assert (reverted["committed_items"], reverted["status"]) == (19, "done")
    rows = c.execute("SELECT id, status, revision FROM public.orders "
                     "WHERE tenant = 'A' AND id <= 20 ORDER BY id").fetchall()
    assert [(r["id"], r["status"], r["revision"]) for r in rows] == [
        (i, "cancelled" if i == 7 else "pending", 3) for i in range(1, 21)]
    assert c.execute("SELECT status FROM etc_batch.job WHERE job_id = 'half'").fetchone()["status"] == "reverted"
    assert c.execute(
        "SELECT bool_and(ok) AS ok FROM etc_batch.verify_job('half-reverted')").fetchone()["ok"] is True
    # what the new version adds works on the updated objects: a parallel approval
    c.execute(
        "SELECT etc_batch.register_job_from_query('after-update', 'B', 'public.orders', "
        "'SELECT id, revision, qty FROM public.orders WHERE tenant = ''B'' AND id <= 12', 4, "
        "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}', parallel => true)")
    parallel = c.execute("CALL etc_batch.drain_job('after-update')").fetchone()
    assert (parallel["committed_chunks"], parallel["committed_items"], parallel["status"]) == (3, 12, "done")
    assert c.execute(
        "SELECT bool_and(ok) AS ok FROM etc_batch.verify_job('after-update')").fetchone()["ok"] is True
    c.execute("UPDATE public.orders SET status = 'pending', revision = 1 WHERE tenant = 'B'")
    # and a launch: background workers drain a job on the updated objects
    c.execute(
        "SELECT etc_batch.register_job_from_query('launched-after-update', 'B', 'public.orders', "
        "'SELECT id, revision, qty FROM public.orders WHERE tenant = ''B'' AND id <= 12', 4, "
        "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}', parallel => true)")
    launch = c.execute(
        "SELECT launch_id FROM etc_batch.launch_job('launched-after-update', 2)").fetchone()["launch_id"]
    deadline = time.monotonic() + 60
    while c.execute("SELECT status FROM etc_batch.launch WHERE launch_id = %s",
                    (launch,)).fetchone()["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert c.execute("SELECT status FROM etc_batch.launch WHERE launch_id = %s",
                     (launch,)).fetchone()["status"] == "done"
    assert c.execute(
        "SELECT bool_and(ok) AS ok FROM etc_batch.verify_job('launched-after-update')").fetchone()["ok"] is True
    assert c.execute("SELECT count(*) AS n FROM public.orders WHERE tenant = 'B' AND status = 'cancelled' "
                     "AND revision = 2").fetchone()["n"] == 12
    c.execute("UPDATE public.orders SET status = 'pending', revision = 1 WHERE tenant = 'B'")

    c.execute("UPDATE public.knob SET ok = true")
    c.execute("SELECT etc_batch.retry_step(3)")
    c.execute("CALL etc_batch.exec_batch_from_id(3)")
    assert [r["step"] for r in c.execute("SELECT step FROM public.loaded ORDER BY step")] == [1, 2, 3, 4, 5]
    assert c.execute(
        "SELECT count(*) AS n FROM etc_batch.batch_log WHERE status = 'done'"
    ).fetchone()["n"] == 5
    # the chain from before takes steps of the new kinds: one that commits, one with a
    # timeout and retries
    c.execute("SELECT etc_batch.add_step('nightly', $$CALL etc_batch.drain_job('half-reverted')$$, 6, commits => true)")
    c.execute("SELECT etc_batch.add_step('nightly', 'INSERT INTO public.loaded VALUES (7)', 7, "
              "timeout => '1 minute', max_attempts => 3)")
    c.execute("CALL etc_batch.exec_batch_from_id(6)")
    assert [r["step"] for r in c.execute("SELECT step FROM public.loaded ORDER BY step")] == [1, 2, 3, 4, 5, 7]
    assert c.execute(
        "SELECT count(*) AS n FROM etc_batch.batch_log WHERE status = 'done'"
    ).fetchone()["n"] == 7

    c.execute("SELECT etc_batch.check_lease('leader', 'w1', 1)")  # raises unless held
    with pytest.raises(psycopg.errors.lookup("0B000")):
        c.execute("SELECT etc_batch.check_lease('former', 'w2', 1)")
    renewed = c.execute("SELECT * FROM etc_batch.acquire_lease('leader', 'w1', '1 hour')").fetchone()
    assert (renewed["acquired"], renewed["generation"]) == (True, 1)
    taken = c.execute("SELECT * FROM etc_batch.acquire_lease('former', 'w3', '1 hour')").fetchone()
    assert (taken["acquired"], taken["holder"], taken["generation"]) == (True, "w3", 2)
    assert c.execute("SELECT count(*) AS n FROM etc_batch.doctor()").fetchone()["n"] > 0


# -- the catalog, as a fresh install makes it -----------------------------------------

CATALOG = """
WITH members AS (
  SELECT d.classid, d.objid
    FROM pg_depend d
    JOIN pg_extension e ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
   WHERE e.extname = 'etc_batch' AND d.deptype = 'e')
SELECT pg_describe_object(m.classid, m.objid, 0) AS object,
       CASE
         WHEN m.classid = 'pg_proc'::regclass THEN
           (SELECT concat_ws(' | ', pg_get_functiondef(p.oid), p.proacl::text, p.proconfig::text,
                             p.prosecdef::text, obj_description(p.oid, 'pg_proc'))
              FROM pg_proc p WHERE p.oid = m.objid)
         WHEN m.classid = 'pg_class'::regclass THEN
           (SELECT concat_ws(' | ', c.relkind::text, c.relacl::text, c.reloptions::text,
                             obj_description(c.oid, 'pg_class'),
                             CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END,
                             (SELECT string_agg(concat_ws(' ', a.attname, format_type(a.atttypid, a.atttypmod),
                                                          a.attnotnull::text, a.attidentity,
                                                          pg_get_expr(ad.adbin, ad.adrelid),
                                                          col_description(c.oid, a.attnum)),
                                                ', ' ORDER BY a.attnum)
                                FROM pg_attribute a
                                LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                               WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                             (SELECT string_agg(pg_get_constraintdef(k.oid), ', ' ORDER BY k.conname)
                                FROM pg_constraint k WHERE k.conrelid = c.oid),
                             (SELECT string_agg(pg_get_indexdef(i.indexrelid), ', '
                                                ORDER BY pg_get_indexdef(i.indexrelid))
                                FROM pg_index i WHERE i.indrelid = c.oid),
                             (SELECT string_agg(pg_get_triggerdef(t.oid), ', ' ORDER BY t.tgname)
                                FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal),
                             (SELECT string_agg(p.polname || ' ' || pg_get_expr(p.polqual, p.polrelid), ', '
                                                ORDER BY p.polname)
                                FROM pg_policy p WHERE p.polrelid = c.oid))
              FROM pg_class c WHERE c.oid = m.objid)
         WHEN m.classid = 'pg_type'::regclass THEN
           (SELECT concat_ws(' | ', format_type(t.typbasetype, t.typtypmod), t.typnotnull::text,
                             (SELECT string_agg(pg_get_constraintdef(k.oid), ', ' ORDER BY k.conname)
                                FROM pg_constraint k WHERE k.contypid = t.oid))
              FROM pg_type t WHERE t.oid = m.objid)
       END AS definition
  FROM members m
UNION ALL
SELECT 'configuration dump of ' || x::regclass::text, coalesce(cond, '')
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u(x, cond)
 WHERE e.extname = 'etc_batch'
ORDER BY 1
"""


def catalog(c):
    return {r["object"]: r["definition"] for r in c.execute(CATALOG)}


def test_released_scripts_are_frozen_and_each_has_an_update_path(current_version):
    sums = {}
    for line in (RELEASED / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        sums[name] = digest
    scripts = sorted(p.name for p in RELEASED.glob("etc_batch--*.sql"))
    assert scripts and sorted(sums) == scripts, "every released script is listed, and only those"
    for name, digest in sums.items():
        assert hashlib.sha256((RELEASED / name).read_bytes()).hexdigest() == digest, (
            f"{name} changed after its release; write an update script instead")
    versions = released_versions()
    assert current_version not in versions or versions[-1] == current_version
    with connect("postgres") as c:
        for v in versions:
            if v == current_version:
                continue
            path = c.execute(
                "SELECT path FROM pg_extension_update_paths('etc_batch') "
                "WHERE source = %s AND target = %s",
                (v, current_version),
            ).fetchone()
            assert path and path["path"], f"no update path from {v} to {current_version}"


@pytest.mark.parametrize("version", released_versions())
def test_update_keeps_every_row_and_ends_as_a_fresh_install(version, current_version):
    if version == current_version:
        pytest.fail(f"{version} is released and is also the version being built: bump Cargo.toml")
    upgraded, fresh = f"etc_batch_from_{version.replace('.', '_')}", "etc_batch_fresh"
    fresh_database(upgraded)
    fresh_database(fresh)
    try:
        # Every connection is closed before a library is installed: a backend keeps the
        # library it loaded, and the file is replaced under it.
        try:
            lib_ok("install_released", version)
            with connect(upgraded) as c:
                c.execute(sql.SQL("CREATE EXTENSION etc_batch VERSION {}").format(sql.Literal(version)))
                assert c.execute(
                    "SELECT extversion FROM pg_extension WHERE extname = 'etc_batch'"
                ).fetchone()["extversion"] == version
                build_state(c)
                # grants a DBA gave on what the update makes again are kept
                c.execute("DROP ROLE IF EXISTS etc_batch_upgrade_reader")
                c.execute("CREATE ROLE etc_batch_upgrade_reader")
                c.execute("GRANT USAGE ON SCHEMA etc_batch TO etc_batch_upgrade_reader")
                c.execute("GRANT SELECT ON etc_batch.job_progress TO etc_batch_upgrade_reader")
                c.execute("GRANT EXECUTE ON FUNCTION etc_batch.prune_history(interval) "
                          "TO etc_batch_upgrade_reader")
                c.execute("GRANT SELECT ON etc_batch.job_item, etc_batch.job_audit "
                          "TO etc_batch_upgrade_reader")
                before = snapshot(c)
                assert_state_built(before)
        finally:
            lib_ok("install_extension")

        with connect(upgraded) as c:
            # the current library refuses to work on the old objects, and says what to do
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as stale:
                c.execute("CALL etc_batch.drain_job('half')")
            assert f"etc_batch {version} is installed in this database" in str(stale.value)
            assert stale.value.diag.message_hint == 'Run "ALTER EXTENSION etc_batch UPDATE" in this database.'
            assert snapshot(c) == before

            c.execute("ALTER EXTENSION etc_batch UPDATE")
            assert c.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'etc_batch'"
            ).fetchone()["extversion"] == current_version
            after = snapshot(c)
            for later, tables in ADDED.items():
                if tuple(map(int, later.split("."))) <= tuple(map(int, version.split("."))):
                    continue
                for table, columns in tables.items():
                    for row in after[table]:
                        for column, value in columns.items():
                            got = row.pop(column)
                            if isinstance(value, OfRow):
                                ok = value.check(got, row)
                            else:
                                ok = value(got) if callable(value) else got == value
                            assert ok, (table, column, got, row)
            for later, tables in CHANGED.items():
                if tuple(map(int, later.split("."))) <= tuple(map(int, version.split("."))):
                    continue
                for table, columns in tables.items():
                    for row in before[table]:
                        for old_name, (new_name, becomes) in columns.items():
                            row[new_name] = becomes(row.pop(old_name))
            if tuple(map(int, version.split("."))) < (0, 3, 0):
                # an audit row's key, revision before and guards moved out of it: they are
                # its approved item's, and job_audit_items reads them there
                items = {
                    (r["job_id"], r["position"]): r
                    for r in c.execute(
                        "SELECT job_id, position, item_key, revision_before, guards "
                        "FROM etc_batch.job_audit_items"
                    ).fetchall()
                }
                for row in before["job_audit"]:
                    item = items[(row["job_id"], row["position"])]
                    for column in ("item_key", "revision_before", "guards"):
                        assert row.pop(column) == item[column], (column, row)
                before["job_audit"].sort(key=lambda r: json.dumps(r, sort_keys=True))
                after["job_audit"].sort(key=lambda r: json.dumps(r, sort_keys=True))
            for table in after:
                for rows in (before[table], after[table]):
                    rows.sort(key=lambda r: json.dumps(r, sort_keys=True))
            assert after == before
            assert c.execute(
                "SELECT has_table_privilege('etc_batch_upgrade_reader', 'etc_batch.job_progress', 'SELECT') "
                "AND has_function_privilege('etc_batch_upgrade_reader', 'etc_batch.prune_history(interval)', "
                "'EXECUTE') AS kept").fetchone()["kept"]
            if tuple(map(int, version.split("."))) >= (0, 3, 0):
                # the frozen list and the audit, tables until 0.4.0 and views of their
                # chunk rows since, are read by whom they were granted to (checked from
                # 0.3.0, whose tables the update to 0.4.0 turns into the views, granting
                # the chunk rows too; from 0.4.0 on, the views were what was granted)
                read = ["job_item", "job_audit"]
                if tuple(map(int, version.split("."))) < (0, 4, 0):
                    read += ["job_item_chunk", "job_audit_chunk"]
                assert c.execute(
                    "SELECT bool_and(has_table_privilege('etc_batch_upgrade_reader', "
                    "'etc_batch.' || t, 'SELECT')) AS kept FROM unnest(%s::text[]) t",
                    (read,)).fetchone()["kept"]
            c.execute("REVOKE ALL ON etc_batch.job_item, etc_batch.job_item_chunk, etc_batch.job_audit, "
                      "etc_batch.job_audit_chunk FROM etc_batch_upgrade_reader")
            c.execute("REVOKE ALL ON etc_batch.job_progress FROM etc_batch_upgrade_reader")
            c.execute("REVOKE ALL ON FUNCTION etc_batch.prune_history(interval) FROM etc_batch_upgrade_reader")
            c.execute("REVOKE ALL ON SCHEMA etc_batch FROM etc_batch_upgrade_reader")
            upgraded_catalog = catalog(c)

        with connect(fresh) as c:
            c.execute("CREATE EXTENSION etc_batch")
            fresh_catalog = catalog(c)
        missing = sorted(set(fresh_catalog) - set(upgraded_catalog))
        extra = sorted(set(upgraded_catalog) - set(fresh_catalog))
        differ = sorted(k for k in set(fresh_catalog) & set(upgraded_catalog)
                        if fresh_catalog[k] != upgraded_catalog[k])
        assert (missing, extra, differ) == ([], [], []), (
            "the update script does not make what a fresh install makes",
            [(k, upgraded_catalog[k], fresh_catalog[k]) for k in differ[:3]])

        # a new connection: the updated functions, not the ones cached before the update
        with connect(upgraded) as c:
            carry_on(c)
    finally:
        drop_database(upgraded)
        drop_database(fresh)
        with connect("postgres") as c:
            c.execute("DROP ROLE IF EXISTS etc_batch_upgrade_reader")


def lib_ok(function, *args):
    done = lib(function, *args, timeout=1800)
    assert done.returncode == 0, (function, args, done.stderr[-4000:])


class OfRow:
    """What an added column holds, checked against the rest of its row."""

    def __init__(self, check):
        self.check = check


def seconds_between(row, first, last):
    from datetime import datetime
    if row[first] is None or row[last] is None:
        return 0
    return (datetime.fromisoformat(row[last]) - datetime.fromisoformat(row[first])).total_seconds()


# columns a version added, and what the update gives the rows that existed before it
ADDED = {
    "0.2.0": {"batch_log": {"search_path": '"$user", public'}, "job": {"search_path": '"$user", public'}},
    # every job a number of its own, which names its partitions
    # and whether its chunks may commit in any order: jobs from before are sequential
    "0.3.0": {"job": {"job_number": lambda n: isinstance(n, int) and n > 0, "parallel": False},
              # and steps can be paused: none is; steps that commit, timeouts and retries:
              # the steps from before run as they did
              "batch_log": {"paused_at": None, "paused_by": None, "commits": False,
                            "timeout": None, "max_attempts": 1}},
    # jobs on any table: a job from before is guarded by its revision column and stops at
    # a drifted item; its target's name is kept for messages; it has neither failed nor
    # been continued; its time at work is what 0.3.0 knew, its first to its last commit;
    # no audit row is a skipped one
    "0.4.0": {"job": {"guard": "revision", "on_drift": "stop",
                      # schema-qualified, as registration writes it (the snapshot reads
                      # the regclass under a search_path that has public)
                      "target_name": OfRow(lambda got, row: got == (
                          row["target"] if "." in row["target"] else f"public.{row['target']}")),
                      "continued_as": None, "failed_at": None, "failure_sqlstate": None,
                      "failure_message": None, "failure_chunk": None,
                      "seconds_at_work": OfRow(lambda got, row: abs(
                          got - seconds_between(row, "started_at", "last_commit_at")) < 1e-3),
                      # the chunks' own seconds were not measured before
                      "chunk_seconds": None,
                      # and no job was reverted, recorded its values before, or sets a
                      # value from each item
                      "reverts": None, "reverted_by": None, "record_before": False,
                      "set_from_items": []},
              "job_audit": {"skipped": False, "found": None}},
    # a step's error keeps its detail: none was kept before
    "0.5.0": {"batch_log": {"last_detail": None},
              # every job from before updates its rows, to values it was given
              "job": {"set_expressions": None, "action": "update", "archive": None,
                      "keep_deleted": True,
                      # how many chunks its last transaction committed: not known of a
                      # job drained before
                      "chunks_per_transaction": None,
                      # its chunks by shard: none was on a table Citus distributes
                      "shards": None}},
}

# columns a version renamed or retyped: their new name, and what the old value becomes
CHANGED = {
    # a key of one or more columns
    "0.4.0": {"job": {"key_column": ("key_columns", lambda v: [v]),
                      # a handler by its name, schema-qualified (the snapshot read the
                      # regprocedure under a search_path that has public)
                      "handler": ("handler", lambda v: v and f"public.{v}".replace("(jsonb)", "(pg_catalog.jsonb)"))}},
}


def pg_tool(tool, *args):
    done = subprocess.run([str(PG_BIN / tool), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (tool, done.stderr)
    return done


def test_pg_dump_and_pg_restore_keep_chains_jobs_audit_and_leases(tmp_path):
    source, restored = "etc_batch_dump_source", "etc_batch_dump_restored"
    fresh_database(source)
    fresh_database(restored)
    try:
        with connect(source) as c:
            c.execute("CREATE EXTENSION etc_batch")
            build_state(c)
            before = snapshot(c)
            assert_state_built(before)
        archive = tmp_path / "etc_batch.dump"
        pg_tool("pg_dump", "-Fc", "-f", str(archive), source)
        pg_tool("pg_restore", "--exit-on-error", "-d", restored, str(archive))

        with connect(restored) as c:
            assert snapshot(c) == before
            # the identity behind the audit rows carries on after the restored ones
            last = max(r["audit_id"] for r in before["step_audit"])
            assert c.execute(
                "SELECT last_value AS v FROM etc_batch.step_audit_audit_id_seq"
            ).fetchone()["v"] >= last
            carry_on(c)
        with connect(source) as c:
            assert snapshot(c) == before, "the source is untouched by the restored copy's work"
    finally:
        drop_database(source)
        drop_database(restored)
