"""Faults a DBA meets, staged for real: a disk that fills (a small tmpfs holding a
tablespace) and, in the tests of the network, links cut between network namespaces the
tests make themselves.

  faults    cluster `faults` on port 55510, started with scripts/lib.sh and stopped at the
            end of the module, whatever happened; each test makes databases of its own
  small     a tmpfs mounted under target/faults for the test, with a tablespace on it
            and a ballast file that leaves only `room` bytes free; unmounted after the
            test. Removing the ballast is "freeing space".

These tests mount filesystems and make network namespaces: they run as root.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT, own_cluster  # noqa: E402

PORT = 55510
TEST_DB = "etc_batch_faults"
HOME = ROOT / "target" / "faults"


@pytest.fixture(scope="module")
def faults():
    if os.geteuid() != 0:
        pytest.fail("tests/faults mount filesystems and make network namespaces: run them as root",
                    pytrace=False)
    HOME.mkdir(parents=True, exist_ok=True)
    with own_cluster("faults", PORT, TEST_DB) as cluster:
        yield cluster


class SmallDisk:
    """A tmpfs of `size` bytes at `path`, a directory on it for a tablespace, owned by
    the server's OS user, and a ballast file that `fill` grows until `room` bytes are
    left."""

    def __init__(self, path, size):
        self.path = path
        self.ballast = path / "ballast"
        self.tablespace_dir = path / "ts"
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        self.tablespace_dir.mkdir()
        subprocess.run(["chown", "postgres:postgres", str(self.tablespace_dir)], check=True)

    def free(self):
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, room):
        """Grows the ballast until no more than `room` bytes are free."""
        with open(self.ballast, "ab") as f:
            os.posix_fallocate(f.fileno(), 0, os.path.getsize(self.ballast) + self.free() - room)
        assert self.free() <= room

    def make_room(self):
        """Frees the space the ballast took: what a DBA does when the disk is full."""
        self.ballast.unlink()

    def unmount(self):
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def small(request):
    path = HOME / ("small-" + "".join(c if c.isalnum() else "-" for c in request.node.name[:40]))
    disk = SmallDisk(path, 4 * 1024 * 1024)
    try:
        yield disk
    finally:
        disk.unmount()


class DiskDb:
    """A database of its own with etc_batch installed and a tablespace `small` on the
    test's small disk."""

    def __init__(self, cluster, name, disk):
        self.cluster = cluster
        self.name = name
        self.disk = disk

    def connect(self, **kwargs):
        return self.cluster.connect(self.name, **kwargs)


@pytest.fixture
def disk_db(faults, small, request):
    name = "disk_" + str(abs(hash(request.node.name)) % 10**8)
    with faults.connect("postgres") as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    db = DiskDb(faults, name, small)
    with db.connect() as conn:
        conn.execute("CREATE EXTENSION etc_batch")
    with faults.connect("postgres") as conn:
        conn.execute(f"CREATE TABLESPACE {name} LOCATION '{small.tablespace_dir}'")
    db.tablespace = name
    try:
        yield db
    finally:
        with faults.connect("postgres") as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"DROP TABLESPACE IF EXISTS {name}")
