"""The application's latency next to a drain: what a DBA asks before leaving a big drain
running on a live primary.

Two application sessions update single rows of the drained table in autocommit, as an
OLTP service does: a random order each time, a quarter of them items of the job (their
change keeps what the job checks, so no conflict), the rest not. Their latency is
measured three times, each over the same stretch of work:
  without a drain   for `seconds`;
  unpaced           while CALL etc_batch.drain_job drains the whole job flat out;
  paced             while the same job, registered again, drains at a fifth of the unpaced
                    drain's rate (etc_batch.pace_job), for as long as that takes.
"""

import statistics
import threading
import time

from common import connect

ITEMS = 200_000
CHUNK = 1000
SESSIONS = 2


def fresh_table(c):
    c.execute("DROP TABLE IF EXISTS app_orders")
    c.execute(
        "CREATE TABLE app_orders (tenant text, id int, revision int NOT NULL DEFAULT 1, "
        "qty int NOT NULL, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))"
    )
    c.execute(
        "INSERT INTO app_orders (tenant, id, qty) SELECT t, g, 1 + g %% 5 "
        "FROM unnest(ARRAY['A', 'B', 'C', 'D']) t, generate_series(1, %s) g",
        (ITEMS,),
    )
    c.execute("VACUUM ANALYZE app_orders")
    c.execute("CHECKPOINT")


def register(c, job):
    c.execute(
        "SELECT etc_batch.register_job_from_query(%s, 'A', 'app_orders', "
        "$$SELECT id, revision, qty FROM app_orders WHERE tenant = 'A'$$, %s, "
        "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}')",
        (job, CHUNK),
    )


def application(db, stop, latencies, seed):
    import random

    rnd = random.Random(seed)
    with connect(db) as c:
        while not stop.is_set():
            tenant = "A" if rnd.random() < 0.25 else rnd.choice("BCD")
            t = time.perf_counter()
            c.execute("UPDATE app_orders SET qty = qty WHERE tenant = %s AND id = %s",
                      (tenant, rnd.randint(1, ITEMS)), prepare=True)
            latencies.append((time.perf_counter() - t) * 1000)


def under(db, seconds=None, drain_job=None):
    """The application's latencies (ms) while `drain_job` drains (or for `seconds`), and
    the drain's rows per second."""
    stop = threading.Event()
    per_session = [[] for _ in range(SESSIONS)]
    apps = [threading.Thread(target=application, args=(db, stop, per_session[i], i)) for i in range(SESSIONS)]
    for t in apps:
        t.start()
    time.sleep(0.5)  # the sessions connected and warm
    for lat in per_session:
        lat.clear()
    t = time.perf_counter()
    if drain_job:
        with connect(db) as c:
            status = c.execute("CALL etc_batch.drain_job(%s)", (drain_job,)).fetchone()[4]
            assert status == "done", status
    else:
        time.sleep(seconds)
    elapsed = time.perf_counter() - t
    stop.set()
    for th in apps:
        th.join()
    latencies = sorted(x for lat in per_session for x in lat)
    return {
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 3),
        "updates_per_s": round(len(latencies) / elapsed),
        "drain_rows_per_s": round(ITEMS / elapsed) if drain_job else None,
        "seconds": round(elapsed, 2),
    }


def measure(db, seconds=5):
    with connect(db) as c:
        fresh_table(c)
    out = {"items": ITEMS, "chunk": CHUNK, "sessions": SESSIONS}
    out["without"] = under(db, seconds=seconds)
    with connect(db) as c:
        register(c, "latency-unpaced")
    out["unpaced"] = under(db, drain_job="latency-unpaced")
    with connect(db) as c:
        fresh_table(c)
        register(c, "latency-paced")
        rate = max(1, out["unpaced"]["drain_rows_per_s"] // 5)
        c.execute("SELECT etc_batch.pace_job('latency-paced', %s)", (rate,))
    out["paced_rows_per_second"] = rate
    out["paced"] = under(db, drain_job="latency-paced")
    return out
