"""etc_batch's settings set as docs/launches.md says: ALTER SYSTEM, from a new session.

PostgreSQL knows an extension's settings in a session once the library is loaded there.
Older minor releases of 15 and 16 refuse ALTER SYSTEM of an etc_batch.* setting until
then (with 42704, "unrecognized configuration parameter"); PostgreSQL 17, and the later
minor releases of 15 and 16 into which that change was carried, accept it as a
placeholder. The documented step, LOAD 'etc_batch' first, works on every one.
"""

import psycopg


def known(c):
    return c.execute(
        "SELECT count(*) FROM pg_settings WHERE name = 'etc_batch.max_workers'"
    ).fetchone()[0] == 1


def in_file(c):
    c.execute("SELECT pg_reload_conf()")
    row = c.execute(
        "SELECT setting FROM pg_file_settings WHERE name = 'etc_batch.max_workers' "
        "AND sourcefile LIKE '%postgresql.auto.conf'"
    ).fetchone()
    return row and row[0]


def test_alter_system_sets_max_workers_after_load(pg):
    c = pg.direct()
    try:
        # a new session that has called nothing of etc_batch's
        assert not known(c), "the library is loaded in a new session: this test shows nothing"
        try:
            c.execute("ALTER SYSTEM SET etc_batch.max_workers = 3")
            # taken as a placeholder, and written as given
            assert in_file(c) == "3"
            c.execute("ALTER SYSTEM RESET etc_batch.max_workers")
        except psycopg.errors.UndefinedObject as refused:
            # the older minor releases: refused until the library is loaded
            assert 'unrecognized configuration parameter "etc_batch.max_workers"' in str(refused)
            assert int(c.execute("SHOW server_version_num").fetchone()[0]) < 170000
        c.execute("LOAD 'etc_batch'")
        assert known(c)
        c.execute("ALTER SYSTEM SET etc_batch.max_workers = 2")
        assert in_file(c) == "2"
    finally:
        c.execute("ALTER SYSTEM RESET etc_batch.max_workers")
        c.execute("SELECT pg_reload_conf()")
        c.close()
