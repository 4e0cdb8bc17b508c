"""A primary and a real streaming standby of it, for the tests that need replication.

  primary   cluster `primary` on port 55480, wal_level logical (for a logical slot),
            with the test database and etc_batch installed
  standby   cluster `standby` on port 55481: pg_basebackup -R of the primary over
            loopback, hot standby, streaming; it reports its replay position every
            second (wal_receiver_status_interval), so that a primary sees a resumed replay
            catch up within a second

Both are started with scripts/lib.sh (cluster_start, standby_start) and stopped at the
end of the module, whatever happened. The failover test promotes the standby; nothing
runs after it.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import OwnCluster, lib, own_cluster  # noqa: E402

PRIMARY_PORT = 55480
STANDBY_PORT = 55481
TEST_DB = "etc_batch_replication"


@pytest.fixture(scope="module")
def primary():
    with own_cluster("primary", PRIMARY_PORT, TEST_DB, "wal_level = logical",
                     "max_replication_slots = 10", "max_wal_senders = 10") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def standby(primary):
    done = lib("standby_start", "standby", str(STANDBY_PORT), str(PRIMARY_PORT),
               "wal_receiver_status_interval = 1s")
    try:
        assert done.returncode == 0, f"standby_start failed:\n{done.stdout}\n{done.stderr}"
        cluster = OwnCluster("standby", STANDBY_PORT, TEST_DB)
        with cluster.connect() as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        yield cluster
    finally:
        lib("cluster_stop", "standby")
