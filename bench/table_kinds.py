"""Jobs on the tables DBAs have: what a job costs on a table without a revision column,
and whether a chunk's cost depends on the target's statistics.

Row digest against revision: the same orders, in two tables alike but for the revision
column, one job each with the same change, guards and chunk size: one guarded by the
revision column (which it increments), one by a digest of each row taken at
registration (`revision_column => NULL`), which a chunk computes again for every row it
changes. Each repetition drains both, back to back, in an order that turns; the ratio is
the median of the repetitions' own (digest over revision).

Chunks with and without statistics: a table loaded and never analyzed (autovacuum off
for it), and the same table analyzed; one job of every tenth row in chunks of 5,000 on
each; the time per chunk of each, the ratio the median of the repetitions' own (never
analyzed over analyzed).
"""

import time

from common import connect, summary

CHUNKS = (100, 1000)
STATS_ROWS = 1_000_000
STATS_CHUNK = 5000


def orders_table(c, name, orders, revision):
    c.execute(f"DROP TABLE IF EXISTS {name}")
    c.execute(
        f"CREATE TABLE {name} (tenant text, id int, "
        + ("revision int NOT NULL DEFAULT 1, " if revision else "")
        + "qty int NOT NULL, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))"
    )
    c.execute(
        f"INSERT INTO {name} (tenant, id, qty) SELECT t, g, 1 + g %% 5 "
        "FROM unnest(ARRAY['A', 'B']) t, generate_series(1, %s) g",
        (orders,),
    )
    c.execute(f"VACUUM ANALYZE {name}")
    c.execute("CHECKPOINT")


def drain_orders(db, guard, chunk, orders):
    """Rows per second of one drain of tenant A's orders, guarded by the revision column
    or by a row digest."""
    revision = guard == "revision"
    table = "orders_rev" if revision else "orders_plain"
    with connect(db) as c:
        orders_table(c, table, orders, revision)
        job = f"{guard}-{chunk}-{time.monotonic_ns()}"
        columns = "id, revision, qty" if revision else "id, qty"
        c.execute(
            "SELECT etc_batch.register_job_from_query(%s, 'A', %s::regclass, "
            f"'SELECT {columns} FROM {table} WHERE tenant = ''A''', %s, "
            "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}', "
            "revision_column => %s)",
            (job, table, chunk, "revision" if revision else None),
        )
        t = time.perf_counter()
        status = c.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4]
        seconds = time.perf_counter() - t
        assert status == "done", status
        changed, other = c.execute(
            f"SELECT count(*) FILTER (WHERE tenant = 'A' AND status = 'cancelled'), "
            f"count(*) FILTER (WHERE tenant = 'B' AND status <> 'pending') FROM {table}"
        ).fetchone()
        assert (changed, other) == (orders, 0), (changed, other)
    return orders / seconds


def chunk_ms(db, analyzed):
    """Milliseconds per chunk of a job of every tenth row of a freshly loaded table,
    analyzed or never."""
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS loaded")
        c.execute("CREATE TABLE loaded (id int PRIMARY KEY, v int NOT NULL, st text NOT NULL) "
                  "WITH (autovacuum_enabled = false)")
        c.execute("INSERT INTO loaded SELECT g, g, 'new' FROM generate_series(1, %s) g", (STATS_ROWS,))
        if analyzed:
            c.execute("ANALYZE loaded")
        never = c.execute("SELECT reltuples < 0 FROM pg_class WHERE oid = 'loaded'::regclass").fetchone()[0]
        assert never is not analyzed, "the table's statistics are not what the run needs"
        c.execute("CHECKPOINT")
        job = f"stats-{analyzed}-{time.monotonic_ns()}"
        c.execute(
            "SELECT etc_batch.register_job_from_query(%s, NULL, 'loaded', "
            "'SELECT id FROM loaded WHERE id %% 10 = 0', %s, '{\"st\": \"done\"}', "
            "tenant_column => NULL, revision_column => NULL)",
            (job, STATS_CHUNK),
        )
        t = time.perf_counter()
        chunks, items, _, _, status = c.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
        seconds = time.perf_counter() - t
        assert status == "done" and items == STATS_ROWS // 10, (status, items)
    return seconds * 1000 / chunks


def measure(db, orders, reps):
    out = {"orders": orders, "reps": reps, "digest": {}, "statistics": {}}
    for chunk in CHUNKS:
        runs = {"revision": [], "row": []}
        for rep in range(reps):
            for guard in (("revision", "row") if rep % 2 == 0 else ("row", "revision")):
                runs[guard].append(drain_orders(db, guard, chunk, orders))
            print(f"tables rep={rep + 1} chunk={chunk}: revision {runs['revision'][-1]:,.0f} rows/s, "
                  f"row digest {runs['row'][-1]:,.0f} rows/s", flush=True)
        out["digest"][str(chunk)] = {
            "revision": summary(runs["revision"]), "row": summary(runs["row"]),
            "ratio": summary([d / r for d, r in zip(runs["row"], runs["revision"])]),
        }
    times = {"never": [], "analyzed": []}
    for rep in range(reps):
        for analyzed in ((False, True) if rep % 2 == 0 else (True, False)):
            times["analyzed" if analyzed else "never"].append(chunk_ms(db, analyzed))
        print(f"tables rep={rep + 1}: ms per chunk of {STATS_CHUNK:,}, never analyzed "
              f"{times['never'][-1]:.1f}, analyzed {times['analyzed'][-1]:.1f}", flush=True)
    out["statistics"] = {
        "rows": STATS_ROWS, "items": STATS_ROWS // 10, "chunk": STATS_CHUNK,
        "never_ms": summary(times["never"]), "analyzed_ms": summary(times["analyzed"]),
        "ratio": summary([n / a for n, a in zip(times["never"], times["analyzed"])]),
    }
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS orders_rev, orders_plain, loaded")
    return out
