"""A cluster whose WAL archiving a test can break and mend, for the signals of a job's
pace (pace_job): the archive backlog, a VACUUM of the target, the windows, the throttle
and critical queries, and a launched worker that waits for its windows.

  signals   cluster `signals` on port 55495: archive_mode on, its archive_command copies
            a segment into target/signals-archive/wal only while the file
            target/signals-archive/archiving exists (so the backlog grows while it does
            not);
            shared_preload_libraries = 'etc_batch', for launches; the test database has
            etc_batch installed

Started with scripts/lib.sh and stopped at the end of the module, whatever happened.
"""

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT, own_cluster  # noqa: E402

PORT = 55495
TEST_DB = "etc_batch_signals"
HOME = ROOT / "target" / "signals-archive"
ARCHIVE = HOME / "wal"
ARCHIVING = HOME / "archiving"


@pytest.fixture(scope="module")
def signals():
    shutil.rmtree(HOME, ignore_errors=True)
    ARCHIVE.mkdir(parents=True)
    shutil.chown(ARCHIVE, "postgres", "postgres")
    ARCHIVING.touch()
    command = f"test -f {ARCHIVING} && cp %p {ARCHIVE}/%f"
    with own_cluster("signals", PORT, TEST_DB, "archive_mode = on",
                     f"archive_command = '{command}'", "shared_preload_libraries = 'etc_batch'",
                     "max_worker_processes = 16") as cluster:
        yield cluster
