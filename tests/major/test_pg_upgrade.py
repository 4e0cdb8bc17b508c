"""Major-version upgrades: pg_upgrade with etc_batch's work in flight, as a DBA upgrades.

- From PostgreSQL 16 to 18, copying the files and linking them: on 16, a sequential job
  and a parallel job half drained, a handler job half drained, a paused job, a chain
  stopped at a failed step, a lease held; the cluster stopped and upgraded with 18's
  pg_upgrade into an 18 cluster running etc_batch's build for 18. There every job and
  the chain go on and finish exactly once, verify_job is clean, the history from before
  is all there, and the lease's next generation is above every one handed out before.
- From PostgreSQL 15 to 16 and to 18, `pg_upgrade --check` with the same work in
  flight: every check passes, the one for reg* columns included, which fails for a
  table with a regprocedure column (shown on the same cluster, so that the check is
  known to look). pg_upgrade refuses a reg* column other than regclass, regrole and
  regtype, since it carries no OID of a function over; etc_batch keeps a job's handler
  by its name (job.handler, text).
- Through a dump: the new version's pg_dump piped into its pg_restore, from 15 to 17
  (Debian's own builds, 17's in its Debian 13 root) and from 16 to 18, with the same
  work in flight and the same checks on the new cluster.

The whole upgrade from this machine's PostgreSQL 15 is not run: its build (Debian's
15.20-0+deb12u1) gives every column of every table an attribute option pg_attver that
the 16.2 and 18.6 builds do not know, and pg_upgrade's restore of any table into 16 or
18 fails on it ("unrecognized parameter "pg_attver""), with or without etc_batch; 17's
programs need Debian 13's libraries, 15's Debian 12's, so no pg_upgrade joins them here.

scripts/test runs this suite after the tiers on 16, 17 and 18, which install
etc_batch's builds for them.
"""

import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT, OwnCluster, lib, pg_bin  # noqa: E402

OLD_PORT = 55500
NEW_PORT = 55505  # and the two after it, for pg_upgrade's own servers
TEST_DB = "etc_batch_major"
PG15_BIN = str(pg_bin(15))


ITEMS = 60


def bin_dir(major):
    return ROOT / "target" / "pginstall" / str(major) / "bin"


def ok(done, what):
    assert done.returncode == 0, f"{what} failed:\n{done.stdout}\n{done.stderr}"


def build_state(c):
    """The work in flight, on PostgreSQL 15; what the upgraded cluster must show of it."""
    c.execute("CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1, "
              "status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))")
    c.execute("INSERT INTO orders (tenant, id) SELECT t, g FROM unnest(ARRAY['S', 'P', 'Z', 'H']) t, "
              "generate_series(1, %s) g", (ITEMS,))
    c.execute("CREATE FUNCTION cancel(item jsonb) RETURNS jsonb LANGUAGE sql AS $$ "
              "UPDATE orders SET status = 'cancelled', revision = revision + 1 "
              "WHERE tenant = item->>'tenant' AND id = (item->>'id')::int "
              "AND revision = (item->>'revision')::int RETURNING to_jsonb(orders.*) $$")
    for job, tenant, extra in (("seq", "S", ""), ("par", "P", ", parallel => true"), ("paused", "Z", "")):
        c.execute("SELECT etc_batch.register_job_from_query(%s, %s, 'orders', "
                  "$$SELECT id, revision FROM orders WHERE tenant = '" + tenant + "'$$, 10, "
                  "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}'" + extra + ")", (job, tenant))
    c.execute("SELECT etc_batch.register_job_from_query('handled', 'H', 'orders', "
              "$$SELECT id, revision FROM orders WHERE tenant = 'H'$$, 10, NULL, "
              "handler => 'public.cancel(jsonb)')")
    c.execute("CALL etc_batch.drain_job('seq', 2)")
    c.execute("CALL etc_batch.drain_job('par', 3)")
    c.execute("CALL etc_batch.drain_job('handled', 1)")
    c.execute("CALL etc_batch.drain_job('paused', 1)")
    c.execute("SELECT etc_batch.pause_job('paused')")

    c.execute("CREATE TABLE loaded (step int)")
    c.execute("CREATE TABLE knob (ok boolean)")
    c.execute("INSERT INTO knob VALUES (false)")
    for step in range(1, 6):
        command = ("INSERT INTO loaded SELECT 3 / ok::int FROM knob" if step == 3
                   else f"INSERT INTO loaded VALUES ({step})")
        c.execute("SELECT etc_batch.add_step('nightly', %s, %s)", (command, step))
    try:
        c.execute("CALL etc_batch.exec_batch_from_id(1)")
        raise AssertionError("step 3 did not fail")
    except Exception as e:  # the chain stops at its failed step
        assert "division by zero" in str(e), e
    lease = c.execute("SELECT generation FROM etc_batch.acquire_lease('leader', 'w1', '1 second')").fetchone()[0]
    return {
        "lease": lease,
        "step_audit": c.execute("SELECT * FROM etc_batch.step_audit ORDER BY audit_id").fetchall(),
        "job_audit": c.execute("SELECT job_id, position, chunk FROM etc_batch.job_audit "
                               "ORDER BY job_id, position").fetchall(),
        "committed": dict(c.execute("SELECT job_id, committed FROM etc_batch.job_progress")),
    }


def carry_on(c, before):
    """On the upgraded cluster: the history is there, and the work finishes exactly once."""
    assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'etc_batch'").fetchone()[0]
    assert c.execute("SELECT * FROM etc_batch.step_audit ORDER BY audit_id").fetchall() == before["step_audit"]
    assert c.execute("SELECT job_id, position, chunk FROM etc_batch.job_audit "
                     "ORDER BY job_id, position").fetchall() == before["job_audit"]
    assert dict(c.execute("SELECT job_id, committed FROM etc_batch.job_progress")) == before["committed"]
    assert c.execute("SELECT status::text FROM etc_batch.job WHERE job_id = 'paused'").fetchone() == ("pending",)
    assert c.execute("SELECT handler FROM etc_batch.job WHERE job_id = 'handled'").fetchone() == (
        "public.cancel(pg_catalog.jsonb)",)

    for job in ("seq", "par", "handled"):
        c.execute("CALL etc_batch.drain_job(%s)", (job,))
    # paused before the upgrade, it stays paused after it until resumed
    c.execute("CALL etc_batch.drain_job('paused')")
    assert dict(c.execute("SELECT job_id, committed FROM etc_batch.job_progress"))["paused"] == \
        before["committed"]["paused"]
    c.execute("SELECT etc_batch.resume_job('paused')")
    c.execute("CALL etc_batch.drain_job('paused')")
    for job, tenant in (("seq", "S"), ("par", "P"), ("paused", "Z"), ("handled", "H")):
        assert c.execute("SELECT status::text FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone() == ("done",)
        assert all(ok for _, ok in c.execute("SELECT check_name, ok FROM etc_batch.verify_job(%s)", (job,)))
        audited = Counter(r[0] for r in c.execute(
            "SELECT item_key FROM etc_batch.job_audit_items WHERE job_id = %s", (job,)))
        assert audited == Counter({str(i): 1 for i in range(1, ITEMS + 1)}), (job, audited)
        assert c.execute("SELECT count(*) FILTER (WHERE status = 'cancelled' AND revision = 2), count(*) "
                         "FROM orders WHERE tenant = %s", (tenant,)).fetchone() == (ITEMS, ITEMS)

    c.execute("UPDATE knob SET ok = true")
    c.execute("SELECT etc_batch.retry_step(3)")
    c.execute("CALL etc_batch.exec_batch_from_id(3)")
    assert Counter(r[0] for r in c.execute("SELECT step FROM loaded")) == Counter({s: 1 for s in range(1, 6)})
    assert {r[0] for r in c.execute("SELECT status FROM etc_batch.batch_log WHERE batch = 'nightly'")} == {"done"}

    time.sleep(1.1)  # the lease of one second has expired
    taken = c.execute("SELECT acquired, generation FROM etc_batch.acquire_lease('leader', 'w2', '1 minute')").fetchone()
    assert taken[0] and taken[1] > before["lease"], (taken, before["lease"])
    assert not c.execute("SELECT check_name, detail FROM etc_batch.doctor() WHERE status <> 'ok' "
                         "AND (check_name LIKE 'job %' OR check_name LIKE 'chain %')").fetchall()


def start_with_work_in_flight(name, port, major):
    """A cluster of `major` with etc_batch and the work in flight, stopped; what the
    upgraded cluster must show of it."""
    ok(lib("cluster_start", name, str(port), major=major), f"cluster_start ({major})")
    cluster = OwnCluster(name, port, TEST_DB)
    with cluster.connect("postgres") as c:
        c.execute(f"CREATE DATABASE {TEST_DB}")
    with cluster.connect() as c:
        c.execute("CREATE EXTENSION etc_batch")
        before = build_state(c)
    return cluster, before


@pytest.mark.parametrize("mode", ["copy", "link"])
def test_pg_upgrade_from_16_to_18_carries_work_in_flight(mode):
    old, new = "major_16", f"major_18_{mode}"
    try:
        _, before = start_with_work_in_flight(old, OLD_PORT, 16)
        ok(lib("cluster_stop", old, major=16), "cluster_stop (16)")
        ok(lib("cluster_upgrade", old, new, str(NEW_PORT), mode, str(bin_dir(16)), major=18, timeout=600),
           f"pg_upgrade to 18 ({mode})")
        with OwnCluster(new, NEW_PORT, TEST_DB).connect() as c:
            assert c.execute("SHOW server_version_num").fetchone()[0].startswith("18")
            carry_on(c, before)
    finally:
        lib("cluster_stop", new, major=18)
        lib("cluster_stop", old, major=16)


@pytest.mark.parametrize("major", [16, 18])
def test_pg_upgrade_check_from_15_passes_with_work_in_flight(major):
    old, new = "major_15", f"major_check_{major}"
    try:
        cluster, _ = start_with_work_in_flight(old, OLD_PORT, 15)
        # the check pg_upgrade stops at, shown to look: a regprocedure column refused
        with cluster.connect() as c:
            c.execute("CREATE TABLE public.kept_by_oid (f regprocedure)")
        ok(lib("cluster_stop", old, major=15), "cluster_stop (15)")
        refused = lib("cluster_upgrade", old, new, str(NEW_PORT), "check", PG15_BIN, major=major, timeout=600)
        assert refused.returncode != 0
        assert "reg* data types in user tables" in refused.stdout, refused.stdout
        assert "public.kept_by_oid.f" in refused.stdout and "etc_batch.job" not in refused.stdout, refused.stdout
        ok(lib("cluster_run", old, major=15), "cluster_run (15)")
        with cluster.connect() as c:
            c.execute("DROP TABLE public.kept_by_oid")
        ok(lib("cluster_stop", old, major=15), "cluster_stop (15)")
        checked = lib("cluster_upgrade", old, new, str(NEW_PORT), "check", PG15_BIN, major=major, timeout=600)
        ok(checked, f"pg_upgrade --check to {major}")
        assert "*Clusters are compatible*" in (ROOT / "target" / "pg" / new / "pg_upgrade.log").read_text()
    finally:
        lib("cluster_stop", old, major=15)


@pytest.mark.parametrize("old_major,new_major", [(15, 17), (16, 18)])
def test_pg_dump_into_pg_restore_of_a_new_major_carries_work_in_flight(old_major, new_major):
    """The other way to a new major version: the new version's pg_dump of the old
    database piped into its pg_restore, on a new cluster with etc_batch's build for it.
    From 15 to 17 with Debian's own builds (17's programs run in its Debian 13 root); from
    16 to 18 with the wheels'. (18.6 does not know the column option pg_attver that
    Debian's 15.20 and 17.12 give every column, which their pg_dump keeps.)"""
    old, new = f"dump_{old_major}", f"dump_{new_major}"
    try:
        source, before = start_with_work_in_flight(old, OLD_PORT, old_major)
        ok(lib("cluster_start", new, str(NEW_PORT), major=new_major), f"cluster_start ({new_major})")
        target = OwnCluster(new, NEW_PORT, TEST_DB)
        with target.connect("postgres") as c:
            c.execute(f"CREATE DATABASE {TEST_DB}")
        new_bin = pg_bin(new_major)
        piped = lib("in_pg", "bash", "-c",
                    'set -o pipefail; "$0" -Fc -h "$1" -p "$2" -U postgres "$3" '
                    '| "$4" --exit-on-error -h "$5" -p "$6" -U postgres -d "$3"',
                    str(new_bin / "pg_dump"), str(source.socket_dir), str(OLD_PORT), TEST_DB,
                    str(new_bin / "pg_restore"), str(target.socket_dir), str(NEW_PORT),
                    major=new_major, timeout=300)
        ok(piped, f"pg_dump of {old_major} | pg_restore into {new_major}")
        with target.connect() as c:
            assert c.execute("SHOW server_version_num").fetchone()[0].startswith(str(new_major))
            carry_on(c, before)
    finally:
        lib("cluster_stop", new, major=new_major)
        lib("cluster_stop", old, major=old_major)
