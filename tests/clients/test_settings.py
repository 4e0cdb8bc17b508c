"""etc_batch's settings set as docs/launches.md says: ALTER SYSTEM, from a new session.

PostgreSQL knows an extension's settings in a session once the library is loaded there;
until then ALTER SYSTEM refuses one it does not know (PostgreSQL 15 refuses every such
name). The documented step, LOAD 'etc_batch', makes it work in any session.
"""

import psycopg
import pytest


def known(c):
    return c.execute(
        "SELECT count(*) FROM pg_settings WHERE name = 'etc_batch.max_workers'"
    ).fetchone()[0] == 1


def test_alter_system_sets_max_workers_after_load(pg):
    c = pg.direct()
    try:
        # a new session that has called nothing of etc_batch's
        assert not known(c), "the library is loaded in a new session: this test shows nothing"
        server = c.execute("SHOW server_version_num").fetchone()[0]
        if int(server) < 160000:
            # as the report found it on 15: refused until the library is loaded
            with pytest.raises(psycopg.errors.UndefinedObject) as refused:
                c.execute("ALTER SYSTEM SET etc_batch.max_workers = 2")
            assert 'unrecognized configuration parameter "etc_batch.max_workers"' in str(refused.value)
        c.execute("LOAD 'etc_batch'")
        assert known(c)
        c.execute("ALTER SYSTEM SET etc_batch.max_workers = 2")
        c.execute("SELECT pg_reload_conf()")
        applied = c.execute(
            "SELECT setting FROM pg_file_settings WHERE name = 'etc_batch.max_workers' "
            "AND sourcefile LIKE '%postgresql.auto.conf'"
        ).fetchone()
        assert applied and applied[0] == "2"
    finally:
        c.execute("ALTER SYSTEM RESET etc_batch.max_workers")
        c.execute("SELECT pg_reload_conf()")
        c.close()
