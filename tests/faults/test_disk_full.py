"""A disk that fills in the middle of the work: a tablespace on a small tmpfs whose free
space a ballast file takes, so that a chunk (or a chain's step) needs more room than is
left. The chunk fails with 53100 and rolls back whole, the call ends with that error, the
job stays pending and verifies clean, and once the ballast is gone the next call finishes
every item exactly once. The same with etc_batch's own tables of the job on that disk.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
from psycopg import errors

from support import pg_bin

import work
from work import WIDE, changes, job_state, make_accounts, verify

ITEMS = 10_000
CHUNK = 500


def register(conn, job, parallel):
    work.register(conn, job, ITEMS, CHUNK, parallel)


def assert_stopped_by_full_disk(conn, job, raised):
    """The call failed with 53100, whole chunks committed before it, each of their rows
    changed once with an audit row each, the rest untouched; the job pending."""
    assert raised.value.sqlstate == "53100", raised.value
    assert raised.value.diag.message_primary.startswith("could not extend file"), raised.value
    status, committed = job_state(conn, job)
    assert status == "pending"
    assert 0 < committed < ITEMS and committed % CHUNK == 0, committed
    assert changes(conn) == {1: committed, 0: ITEMS - committed}
    changed = conn.execute("SELECT count(*) FROM accounts WHERE note = %s", (WIDE,)).fetchone()[0]
    assert changed == committed
    verify(conn, job)
    # which chunk, and that the job is pending: said whatever write of the chunk failed
    assert raised.value.diag.message_detail == (
        f'Chunk {committed // CHUNK + 1} of job "{job}" was rolled back; the job is still pending.')
    assert raised.value.diag.message_hint == "Check free disk space."
    return committed


def finish_after_room_is_made(conn, disk, job):
    disk.make_room()
    conn.execute("CALL etc_batch.drain_job(%s)", (job,))
    assert job_state(conn, job) == ("done", ITEMS)
    assert changes(conn) == {1: ITEMS}
    verify(conn, job)


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
def test_target_table_on_a_disk_that_fills_mid_drain(disk_db, parallel):
    """The target's tablespace fills: the chunk that cannot extend the table fails with
    53100 and rolls back whole; the DETAIL says which chunk and that the job is pending."""
    conn = disk_db.connect()
    make_accounts(conn, ITEMS, disk_db.tablespace)
    register(conn, "fill_target", parallel)
    # room for a few chunks' new row versions (each about 80 kB), not for all twenty; in
    # whole pages, so that the write that fails writes nothing
    disk_db.disk.fill(296 * 1024)
    if not parallel:
        # as psql shows it at the default etc_batch.progress_interval (docs/faults.md
        # quotes this file); the file's path, which holds OIDs, as ...
        shown = subprocess.run(
            [str(pg_bin() / "psql"), "-X", "-e", "-h", str(disk_db.cluster.socket_dir),
             "-p", str(disk_db.cluster.port), "-U", "postgres", "-d", disk_db.name,
             "-c", "CALL etc_batch.drain_job('fill_target')"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PGOPTIONS": "-c etc_batch.progress_interval=1s"})
        said = re.sub(r'"pg_tblspc/[^"]*"', '"pg_tblspc/..."', shown.stdout + shown.stderr)
        assert said == (Path(__file__).parent / "expected" / "disk_full.out").read_text()
    with pytest.raises(errors.DiskFull) as raised:
        conn.execute("CALL etc_batch.drain_job('fill_target')")
    stopped_at = assert_stopped_by_full_disk(conn, "fill_target", raised)
    # another call while the disk is still full fails the same way, changing nothing
    with pytest.raises(errors.DiskFull):
        conn.execute("CALL etc_batch.drain_job('fill_target')")
    assert job_state(conn, "fill_target") == ("pending", stopped_at)
    finish_after_room_is_made(conn, disk_db.disk, "fill_target")


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
def test_etc_batch_tables_of_the_job_on_a_disk_that_fills_mid_drain(disk_db, parallel):
    """The job's own tables (its row, its items, its audit) on the disk that fills, the
    target elsewhere: the audit of the chunk cannot be written, and the whole chunk, its
    change to the target included, rolls back. (Before, the error reached the caller
    without the DETAIL that names the chunk and says the job is pending.)"""
    conn = disk_db.connect()
    make_accounts(conn, ITEMS)
    register(conn, "fill_audit", parallel)
    relations = [r[0] for r in conn.execute(
        "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'etc_batch' AND c.relkind = 'r' "
        "AND (c.relname = 'job' OR c.relname ~ '^job_(audit|item|chunk)_chunk_[0-9]+$' "
        "OR c.relname ~ '^job_chunk_[0-9]+$')")]
    assert len(relations) == (4 if parallel else 3), relations
    for relation in relations:
        conn.execute(f"ALTER TABLE {relation} SET TABLESPACE {disk_db.tablespace}")
    disk_db.disk.fill(48 * 1024)
    with pytest.raises(errors.DiskFull) as raised:
        conn.execute("CALL etc_batch.drain_job('fill_audit')")
    assert_stopped_by_full_disk(conn, "fill_audit", raised)
    finish_after_room_is_made(conn, disk_db.disk, "fill_audit")


def test_chain_step_failing_on_a_full_disk_is_recorded_and_retried(disk_db):
    """A step that loads a table on the full disk fails with 53100: recorded as failed
    with that SQLSTATE, the chain stopped there; retry_step after space is freed, and the
    chain runs on, every step once."""
    conn = disk_db.connect()
    conn.execute(f"CREATE TABLE loaded (id int, body text) TABLESPACE {disk_db.tablespace}")
    conn.execute("CREATE TABLE ran (step int)")
    commands = [
        "INSERT INTO ran VALUES (1)",
        "INSERT INTO ran VALUES (2); INSERT INTO loaded SELECT g, repeat('y', 400) FROM generate_series(1, 5000) g",
        "INSERT INTO ran VALUES (3)",
    ]
    ids = [conn.execute("SELECT etc_batch.add_step('load', %s)", (c,)).fetchone()[0] for c in commands]
    disk_db.disk.fill(256 * 1024)
    with pytest.raises(errors.DiskFull) as raised:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (ids[0],))
    assert raised.value.sqlstate == "53100"

    def steps():
        return [conn.execute("SELECT status, attempts, last_sqlstate FROM etc_batch.batch_log WHERE id = %s",
                             (i,)).fetchone() for i in ids]

    assert steps() == [("done", 1, None), ("failed", 1, "53100"), ("pending", 0, None)]
    audit = conn.execute("SELECT outcome, sqlstate FROM etc_batch.step_audit WHERE step_id = %s "
                         "ORDER BY audit_id", (ids[1],)).fetchall()
    assert audit == [("failed", "53100")]
    assert conn.execute("SELECT count(*) FROM loaded").fetchone()[0] == 0
    with pytest.raises(errors.ObjectNotInPrerequisiteState):
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (ids[0],))

    disk_db.disk.make_room()
    conn.execute("SELECT etc_batch.retry_step(%s)", (ids[1],))
    conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (ids[0],))
    assert steps() == [("done", 1, None), ("done", 2, "53100"), ("done", 1, None)]
    ran = conn.execute("SELECT step, count(*) FROM ran GROUP BY step ORDER BY step").fetchall()
    assert ran == [(1, 1), (2, 1), (3, 1)]
    assert conn.execute("SELECT count(*) FROM loaded").fetchone()[0] == 5000
