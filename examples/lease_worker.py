"""A worker that drains a job only while it holds the job's lease, through any pooler.

    python examples/lease_worker.py "host=127.0.0.1 port=6432 dbname=app" worker-3 festival

Every tick it acquires or renews the lease; only the holder drains, one chunk per tick,
passing its generation as the fence; a failed fence (SQLSTATE 0B000) means the lease
moved on while this worker stalled, and it steps down until it wins the lease again.
"""

import sys
import time

import psycopg


def work(dsn, me, job, lease=None, ttl="30 seconds", tick=5.0, max_ticks=None):
    """Returns the number of chunks this worker committed once the job is done (or
    after max_ticks)."""
    lease = lease or f"{job}-drainer"
    committed = 0
    # autocommit: drain_job commits as it goes; prepare_threshold=None: PgBouncer in
    # transaction mode cannot follow server-side prepared statements.
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        ticks = 0
        while max_ticks is None or ticks < max_ticks:
            ticks += 1
            acquired, _holder, generation, _expires = conn.execute(
                "SELECT * FROM etc_batch.acquire_lease(%s, %s, %s)", (lease, me, ttl)
            ).fetchone()
            if acquired:
                try:
                    chunks, _items, _first, _last, status = conn.execute(
                        "CALL etc_batch.drain_job(%s, 1, lease_name => %s, lease_holder => %s,"
                        " lease_generation => %s)",
                        (job, lease, me, generation),
                    ).fetchone()
                    committed += chunks
                    if status == "done":
                        conn.execute("SELECT etc_batch.release_lease(%s, %s)", (lease, me))
                        return committed
                except psycopg.errors.InvalidTransactionInitiation:
                    pass  # the lease is gone: step down; the next tick asks again
            elif conn.execute(
                "SELECT status FROM etc_batch.job_progress WHERE job_id = %s", (job,)
            ).fetchone()[0] == "done":
                return committed
            time.sleep(tick)
    return committed


if __name__ == "__main__":
    work(sys.argv[1], sys.argv[2], sys.argv[3])
