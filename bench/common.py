"""What every part of the benchmark shares: how it connects, how it sums up repetitions,
how it reads the WAL written."""

import os
import platform
import statistics
import subprocess
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent


def machine():
    """The cores, CPU, memory and kernel a result was measured on."""
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((l.split(":", 1)[1].strip() for l in open("/proc/meminfo") if l.startswith("MemTotal")), "?")
    return f"{os.cpu_count()} cores, {cpu}, {mem} memory, {platform.system()} {platform.release()}"


def commit(*paths):
    """The commit measured, and whether `paths` (what the result depends on) had changes
    not yet committed."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(git + ["status", "--porcelain", *paths], capture_output=True, text=True).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def connect(db, **kw):
    """An autocommit connection to `db`. Sessions run with client_min_messages at its
    default, notice, as psql and pg_cron sessions have it: what etc_batch tells its
    caller (at most a NOTICE a second and one at the end of a call,
    etc_batch.progress_interval's default) is part of what it costs, sent and received;
    the client drops it."""
    kw.setdefault("autocommit", True)
    conn = psycopg.connect(dbname=db, **kw)
    conn.add_notice_handler(lambda d: None)
    return conn


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def lsn(c):
    return c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def wal_since(c, since):
    """Bytes of WAL written since `since` (an lsn), by anyone."""
    return int(c.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (since,)).fetchone()[0])
