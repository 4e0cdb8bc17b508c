"""Tenant isolation: a job for one tenant never reads or changes a row of another,
whatever the keys, when the tenant column is not text.

Two tenants share every key. The tenant column is a uuid in one table and an integer
in another; the job's tenant is given as text and compared in the column's own type.
Each test checks the other tenant's rows against the table as it was created, and the
reports against the approved tenant's rows only.
"""

import uuid

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

ORG_A = uuid.UUID("00000000-0000-4000-8000-00000000000a")
ORG_B = uuid.UUID("00000000-0000-4000-8000-00000000000b")
KEYS = range(1, 41)


def make_table(c, name, tenant_type, tenants):
    c.execute(sql.SQL(
        "CREATE TABLE {} (org {} NOT NULL, id bigint NOT NULL, revision integer NOT NULL, "
        "qty integer NOT NULL, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (org, id))"
    ).format(sql.Identifier(name), sql.SQL(tenant_type)))
    for t in tenants:
        # the same keys in both tenants, at revisions and quantities that differ by tenant
        c.execute(
            sql.SQL("INSERT INTO {} (org, id, revision, qty) "
                    "SELECT %s, g, 1 + g %% 3, 1 + (g + %s) %% 5 FROM generate_series(1, 40) g")
            .format(sql.Identifier(name)),
            (t, 0 if t in (ORG_A, 7) else 2),
        )


def rows(c, name):
    return {
        (r["org"], r["id"]): (r["revision"], r["qty"], r["status"])
        for r in c.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(name))).fetchall()
    }


def items_of(table, tenant, keys):
    return [{"id": k, "revision": table[(tenant, k)][0], "qty": table[(tenant, k)][1]} for k in keys]


def register(c, job, tenant, target, items, chunk_size=7):
    return c.execute(
        "SELECT * FROM etc_batch.register_job(job_id => %s, tenant => %s, target => %s::regclass, "
        "items => %s, chunk_size => %s, set_values => '{\"status\": \"cancelled\"}', "
        "expect => '{\"status\": \"pending\"}', tenant_column => 'org')",
        (job, str(tenant), target, Jsonb(items), chunk_size),
    ).fetchone()


@pytest.fixture
def conn(db):
    c = psycopg.connect(dbname=db.name, autocommit=True, row_factory=dict_row)
    c.add_notice_handler(lambda d: None)
    yield c
    c.close()


@pytest.mark.parametrize(
    "tenant_type, a, b", [("uuid", ORG_A, ORG_B), ("integer", 7, 8)], ids=["uuid", "integer"]
)
def test_a_job_changes_its_tenant_only_with_colliding_keys(conn, tenant_type, a, b):
    name = f"accounts_{tenant_type}"
    make_table(conn, name, tenant_type, (a, b))
    before = rows(conn, name)
    approved = list(KEYS)[::2]
    register(conn, f"iso-{tenant_type}", a, name, items_of(before, a, approved))
    conn.execute("CALL etc_batch.drain_job(%s)", (f"iso-{tenant_type}",))

    after = rows(conn, name)
    for k in KEYS:
        rev, qty, status = before[(a, k)]
        expected = (rev + 1, qty, "cancelled") if k in approved else (rev, qty, status)
        assert after[(a, k)] == expected, (a, k)
        assert after[(b, k)] == before[(b, k)], ("the other tenant's row changed", b, k)
    report = conn.execute(
        "SELECT item_key, state, revision_now FROM etc_batch.job_report(%s) ORDER BY position",
        (f"iso-{tenant_type}",),
    ).fetchall()
    # the report reads the approved tenant's rows: their revisions, not the other's
    assert [(r["item_key"], r["state"], r["revision_now"]) for r in report] == [
        (str(k), "matching", before[(a, k)][0] + 1) for k in approved
    ]
    audit = conn.execute(
        "SELECT count(*) AS n, count(DISTINCT item_key) AS keys FROM etc_batch.job_audit_items "
        "WHERE job_id = %s",
        (f"iso-{tenant_type}",),
    ).fetchone()
    assert audit == {"n": len(approved), "keys": len(approved)}


def test_a_key_only_the_other_tenant_has_is_a_conflict_not_a_change(conn):
    make_table(conn, "accounts_gap", "uuid", (ORG_A, ORG_B))
    conn.execute("DELETE FROM accounts_gap WHERE org = %s AND id = 40", (ORG_A,))
    before = rows(conn, "accounts_gap")
    # key 40 is gone from tenant A; tenant B's row 40 has the revision and quantity the
    # approval names, so only the tenant tells them apart
    items = items_of(before, ORG_A, range(34, 40)) + [
        {"id": 40, "revision": before[(ORG_B, 40)][0], "qty": before[(ORG_B, 40)][1]}
    ]
    register(conn, "iso-gap", ORG_A, "accounts_gap", items, chunk_size=7)
    with pytest.raises(errors.IntegrityError) as conflict:
        conn.execute("CALL etc_batch.drain_job('iso-gap')")
    assert conflict.value.sqlstate == "23000"
    assert rows(conn, "accounts_gap") == before, "the whole chunk rolled back, B untouched"
    summary = conn.execute("SELECT * FROM etc_batch.job_summary('iso-gap')").fetchone()
    assert (summary["status"], summary["committed"], summary["missing"]) == ("conflict", 0, 0)
    missing = conn.execute(
        "SELECT state FROM etc_batch.job_report('iso-gap') WHERE item_key = '40'"
    ).fetchone()
    assert missing["state"] == "unprocessed"


def test_a_tenant_that_is_not_of_the_columns_type_is_refused_and_nothing_is_stored(conn):
    make_table(conn, "accounts_typed", "integer", (7, 8))
    before = rows(conn, "accounts_typed")
    for bad in ("seven", "7; DELETE FROM accounts_typed", "99999999999"):
        with pytest.raises(psycopg.Error) as refused:
            register(conn, "iso-typed", bad, "accounts_typed", items_of(before, 7, [1, 2]))
        # an argument of the call is wrong, so invalid_parameter_value, naming the column
        assert refused.value.sqlstate == "22023", (bad, refused.value.sqlstate)
        assert 'the tenant for column "org"' in str(refused.value)
        assert conn.execute(
            "SELECT (SELECT count(*) FROM etc_batch.job WHERE job_id = 'iso-typed') AS jobs, "
            "(SELECT count(*) FROM etc_batch.job_item WHERE job_id = 'iso-typed') AS items"
        ).fetchone() == {"jobs": 0, "items": 0}
    assert rows(conn, "accounts_typed") == before
