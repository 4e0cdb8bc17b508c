"""A cluster of its own, `crash` on port 55470, for killing the whole server.

The tests stop the server with `pg_ctl stop -m immediate` in the middle of a drain or a
chain: every server process is killed at once, nothing is flushed or checkpointed, and
the next start has to run crash recovery from the WAL. That is a different event from
a single backend dying (tests/integration), where the postmaster cleans up and the
other sessions live on, so it needs a cluster nobody else uses. fsync is on, or a
crash would prove nothing about what reached the disk.

The cluster is started with scripts/lib.sh's cluster_start, restarted after each crash
the same way cluster_start starts it (pg_ctl as the postgres OS user, with
RUST_BACKTRACE set), and stopped at the end of the module, whatever happened.

The random moments come from one seed, printed in the summary and in every failure;
ETC_BATCH_CRASH_SEED=<seed> makes the same random choices again: chunk sizes, approved
keys, step lists, sleeps, and where in a round the crash falls. Job sizes and delays in
seconds also follow the speed the machine shows, so the exact moment does not replay.
"""

import os
import pwd
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT, WAIT, OwnCluster, lib, pg_bin, wait_until  # noqa: E402,F401

NAME = "crash"
PORT = 55470
CLUSTER_DIR = ROOT / "target" / "pg" / NAME
DATA_DIR = CLUSTER_DIR / "data"
SERVER_LOG = CLUSTER_DIR / "server.log"
PG_BIN = pg_bin()
PG_OS_USER = "postgres"
TEST_DB = "etc_batch_crash"

# Every start after a crash writes this line before it replays the WAL.
RECOVERY_LINE = "database system was not properly shut down; automatic recovery in progress"

SEED = int(os.environ.get("ETC_BATCH_CRASH_SEED") or random.SystemRandom().randrange(1, 2**31))

# What the module saw, for the terminal summary (visible with -q).
REPORT = {"seed": SEED, "lines": []}


def _as_pg(argv):
    """argv run as the postgres OS user, as lib.sh's as_pg does."""
    if os.geteuid() == 0:
        return ["runuser", "-u", PG_OS_USER, "--", *argv]
    if pwd.getpwuid(os.geteuid()).pw_name == PG_OS_USER:
        return list(argv)
    return ["sudo", "-n", "runuser", "-u", PG_OS_USER, "--", *argv]


class CrashCluster(OwnCluster):
    seed = SEED

    def __init__(self):
        super().__init__(NAME, PORT, TEST_DB)
        self.crashes = 0

    def recoveries(self):
        return self.server_log().count(RECOVERY_LINE)

    def crash(self):
        """Kills every server process at once, as a power cut would leave the disk."""
        done = subprocess.run(
            _as_pg([str(PG_BIN / "pg_ctl"), "-D", str(DATA_DIR), "-m", "immediate", "-w", "stop"]),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"pg_ctl stop -m immediate failed:\n{done.stdout}\n{done.stderr}"
        assert not (DATA_DIR / "postmaster.pid").exists(), "the postmaster outlived the immediate stop"
        self.crashes += 1

    def start(self):
        # As cluster_start starts it, with RUST_BACKTRACE set.
        done = subprocess.run(
            _as_pg(
                [
                    "env", "RUST_BACKTRACE=1",
                    str(PG_BIN / "pg_ctl"), "-D", str(DATA_DIR), "-l", str(SERVER_LOG),
                    "-w", "-t", "120", "start",
                ]
            ),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, (
            f"pg_ctl start after the crash failed:\n{done.stdout}\n{done.stderr}\n"
            f"server log tail:\n{self.server_log()[-4000:]}"
        )

    def crash_and_restart(self):
        """Crashes the server and starts it again; fails unless the start really ran
        crash recovery (so the crash was not a clean shutdown in disguise)."""
        before = self.recoveries()
        self.crash()
        self.start()
        assert self.recoveries() == before + 1, (
            "the restart did not run crash recovery; server log tail:\n"
            + self.server_log()[-4000:]
        )


@pytest.fixture(scope="module")
def crash_cluster():
    """Cluster `crash` on port 55470, fsync on, with a test database that has etc_batch
    installed; stopped at the end."""
    started = time.monotonic()
    done = lib("cluster_start", NAME, str(PORT), "fsync = on")
    try:
        assert done.returncode == 0, f"cluster_start {NAME} failed:\n{done.stdout}\n{done.stderr}"
        cluster = CrashCluster()
        with cluster.connect("postgres") as conn:
            # cluster_start writes fsync = off before the lines it is given; the last wins
            for setting, wanted in (("fsync", "on"), ("synchronous_commit", "on"),
                                    ("full_page_writes", "on")):
                value = conn.execute(f"SHOW {setting}").fetchone()[0]
                assert value == wanted, f"{setting} is {value}, the crash tests need {wanted}"
            conn.execute(f"CREATE DATABASE {TEST_DB}")
        with cluster.connect() as conn:
            conn.execute("CREATE EXTENSION etc_batch")
        REPORT["lines"].append(f"cluster start {time.monotonic() - started:.1f}s")
        yield cluster
    finally:
        stopped = lib("cluster_stop", NAME)
        REPORT["lines"].append(f"module total {time.monotonic() - started:.1f}s")
        if stopped.returncode != 0 and (DATA_DIR / "postmaster.pid").exists():
            # A server that will not stop cleanly (say, stuck after a failed recovery)
            # must still not outlive the module.
            CrashCluster().crash()
            raise AssertionError(f"cluster_stop {NAME} failed: {stopped.stderr}")


@pytest.fixture(scope="module")
def crash_report():
    """Where a test records what its rounds did, for the terminal summary."""
    return REPORT["lines"]


def pytest_terminal_summary(terminalreporter):
    if REPORT["lines"]:
        terminalreporter.write_line(
            f"tests/crash: seed {SEED} (ETC_BATCH_CRASH_SEED={SEED} makes the same random choices)"
        )
        for line in REPORT["lines"]:
            terminalreporter.write_line(f"tests/crash: {line}")
