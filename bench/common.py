"""What every part of the benchmark shares: how it connects, how it sums up repetitions,
how it reads the WAL written."""

import statistics

import psycopg


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
