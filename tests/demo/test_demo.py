"""scripts/demo as a user runs it, against the tests' private copy of PostgreSQL 15
(ETC_BATCH_INSTALL=private: the demo otherwise builds into the system's own) on a port
of its own: each act shows what the README says it shows, nothing warns or fails but
the runner the demo kills on purpose, and the cluster is left running for the user
until scripts/demo-stop stops it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT  # noqa: E402

PORT = 55434


def after(out, call):
    """The output that follows the line showing `call`, up to the next command."""
    start = out.index(call)
    end = out.find("\n$ psql", start + len(call))
    return out[start:end if end >= 0 else len(out)]


def test_the_demo_shows_a_job_a_launch_a_nightly_chain_a_purge_and_its_undo():
    env = {**os.environ, "ETC_BATCH_INSTALL": "private", "ETC_BATCH_DEMO_PORT": str(PORT)}
    try:
        done = subprocess.run(["bash", "scripts/demo"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=900)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        assert "WARNING" not in out and "ERROR" not in out, out
        # 1. the runner killed mid-job (the demo's one FATAL), the job resumed and verified
        assert out.count("FATAL:  terminating connection due to administrator command") == 1
        assert re.search(r"settle \| pending \|\s+\d+ \|\s+14000 \|", out)
        resumed = after(out, "CALL etc_batch.drain_job('settle')\"")
        assert "the job is done" in resumed
        verified = after(out, "verify_job('settle')")
        assert verified.count("| t") == 6 and "| f" not in verified
        # 2. the backfill launched with two workers, finished by the server
        workers = after(out, "FROM etc_batch.launches ORDER BY worker")
        assert workers.count("| launch     |") == 2 and "(2 rows)" in workers
        assert re.search(r"backfilled \| count\s*\n-+\+-+\s*\n\s+20000 \|\s+20000", out)
        # 3. the nightly line fired twice: one run, each step done once and skipped once
        assert re.search(r"nightly \| 2026-12-01 \| nightly/2026-12-01\s*\n\(1 row\)", out)
        audit = after(out, "FROM etc_batch.step_audit ORDER BY audit_id")
        assert audit.count("| pending     | done") == 3 and audit.count("| done        | skipped") == 3
        # 4. the purge, and its undo putting every row back
        assert re.search(r"orders_left\s*\n-+\s*\n\s+18200", out)
        assert re.search(r"orders_back\s*\n-+\s*\n\s+20000", out)
        assert re.search(r"purge-old-cancelled\s+\| reverted", out)
        assert re.search(r"purge-old-cancelled-undo \| done", out)
        # left running for the user
        with psycopg.connect(host=str(ROOT / "target" / "pg" / "demo"), port=PORT, user="postgres",
                             dbname="demo", connect_timeout=10) as conn:
            assert conn.execute("SELECT count(*) FROM orders").fetchone() == (20000,)
    finally:
        stopped = subprocess.run(["bash", "scripts/demo-stop"], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
    assert not (ROOT / "target" / "pg" / "demo" / "data" / "postmaster.pid").exists()
