"""Launched workers against client sessions: N background workers launched on a
parallel job (etc_batch.launch_job) against N client sessions each calling
CALL etc_batch.drain_job on the same kind of job, for N = 1, 2 and 4, at chunk 100 and
1,000; and how long a launch takes from launch_job returning to its first chunk
committed.

Each repetition runs both, back to back, in an order that turns, on a fresh copy of
the orders; the ratio is the median of the repetitions' own (workers over sessions).
A launch's time is the server's: from launch_job returning (its workers connected and
waiting for the launching transaction's commit) to the launch ending done
(launch.ended_at); the sessions' is the client's, from the moment all of them are
connected and released at once to the last call returning.
"""

import statistics
import threading
import time

from common import connect, summary

DRAINERS = (1, 2, 4)
CHUNKS = (100, 1000)


def fresh(c, orders):
    c.execute("DROP TABLE IF EXISTS launch_orders")
    c.execute(
        "CREATE TABLE launch_orders (tenant text, id int, revision int NOT NULL DEFAULT 1, "
        "qty int NOT NULL, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))"
    )
    c.execute(
        "INSERT INTO launch_orders (tenant, id, qty) SELECT t, g, 1 + g %% 5 "
        "FROM unnest(ARRAY['A', 'B']) t, generate_series(1, %s) g",
        (orders,),
    )
    c.execute("VACUUM ANALYZE launch_orders")
    c.execute("CHECKPOINT")


def register(c, job, chunk):
    c.execute(
        "SELECT etc_batch.register_job_from_query(%s, 'A', 'launch_orders', "
        "$$SELECT id, revision, qty FROM launch_orders WHERE tenant = 'A'$$, %s, "
        "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}', parallel => true)",
        (job, chunk),
    )


def check(c, orders):
    done = c.execute(
        "SELECT count(*) FILTER (WHERE tenant = 'A' AND status = 'cancelled' AND revision = 2) "
        "FROM launch_orders").fetchone()[0]
    assert done == orders, done


def sessions(db, orders, chunk, n):
    """Rows per second of n client sessions draining one parallel job."""
    with connect(db) as c:
        fresh(c, orders)
        job = f"sessions-{n}-{chunk}-{time.monotonic_ns()}"
        register(c, job, chunk)
    conns = [connect(db) for _ in range(n)]
    barrier = threading.Barrier(n + 1)
    errors = []

    def drain(conn):
        try:
            barrier.wait(60)
            conn.execute("CALL etc_batch.drain_job(%s)", (job,))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=drain, args=(conn,)) for conn in conns]
    for t in threads:
        t.start()
    barrier.wait(60)
    started = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    for conn in conns:
        conn.close()
    assert not errors, errors
    with connect(db) as c:
        check(c, orders)
    return orders / seconds


def workers(db, orders, chunk, n):
    """Rows per second of n launched workers draining one parallel job, by the server's
    clock; and the seconds from launch_job returning to the first chunk committed."""
    with connect(db) as c:
        fresh(c, orders)
        job = f"workers-{n}-{chunk}-{time.monotonic_ns()}"
        register(c, job, chunk)
        launch_id = c.execute("SELECT launch_id FROM etc_batch.launch_job(%s, %s)", (job, n)).fetchone()[0]
        returned = c.execute("SELECT clock_timestamp()").fetchone()[0]
        deadline = time.monotonic() + 600
        while c.execute("SELECT status FROM etc_batch.launch WHERE launch_id = %s",
                        (launch_id,)).fetchone()[0] == "running":
            assert time.monotonic() < deadline, "the launch did not end"
            time.sleep(0.05)
        status, seconds, first = c.execute(
            "SELECT l.status, extract(epoch FROM l.ended_at - %s), "
            "(SELECT min(ch.committed_at) FROM etc_batch.job_chunk ch WHERE ch.job_id = l.job_id) "
            "FROM etc_batch.launch l WHERE l.launch_id = %s", (returned, launch_id)).fetchone()
        assert status == "done", status
        check(c, orders)
        return orders / float(seconds), (first - returned).total_seconds()


def paired(db, orders, chunk, n, reps, latencies=None):
    """Rows per second of n sessions and of n launched workers on the same job, `reps`
    times back to back in an order that turns; each launch's time to its first chunk is
    appended to `latencies` when given."""
    runs = {"sessions": [], "workers": []}
    for rep in range(reps):
        for kind in (("sessions", "workers") if rep % 2 == 0 else ("workers", "sessions")):
            if kind == "sessions":
                runs["sessions"].append(sessions(db, orders, chunk, n))
            else:
                rate, latency = workers(db, orders, chunk, n)
                runs["workers"].append(rate)
                if latencies is not None:
                    latencies.append(latency)
        print(f"launches {orders:,} orders chunk={chunk} n={n} rep={rep + 1}: sessions "
              f"{runs['sessions'][-1]:,.0f}, workers {runs['workers'][-1]:,.0f} rows/s", flush=True)
    return runs


def at_sizes(db, sizes, reps, chunk=100, n=2):
    """n launched workers against n client sessions on one parallel job at `chunk`, at
    each number of orders in `sizes`: a launch's fixed start and end weigh most on a
    small job."""
    out = {}
    for orders in sizes:
        runs = paired(db, orders, chunk, n, reps)
        out[str(orders)] = {
            "chunk": chunk, "drainers": n, "reps": reps,
            "sessions": summary(runs["sessions"]), "workers": summary(runs["workers"]),
            "ratio": summary([w / s for w, s in zip(runs["workers"], runs["sessions"])]),
        }
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS launch_orders")
    return out


def measure(db, orders, reps):
    out = {"orders": orders, "reps": reps, "ratios": {}, "sessions": {}, "workers": {}}
    latencies = []
    for chunk in CHUNKS:
        for n in DRAINERS:
            runs = paired(db, orders, chunk, n, reps, latencies)
            key = f"{chunk}/{n}"
            out["sessions"][key] = summary(runs["sessions"])
            out["workers"][key] = summary(runs["workers"])
            out["ratios"][key] = summary([w / s for w, s in zip(runs["workers"], runs["sessions"])])
    ordered = sorted(latencies)
    out["first_chunk_ms"] = {
        "median": round(statistics.median(ordered) * 1000, 1),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1),
        "launches": len(ordered),
    }
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS launch_orders")
    return out
