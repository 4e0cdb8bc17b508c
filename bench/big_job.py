"""A job of many items registered from a query and drained to the end by one call:
registration time and the registering backend's private memory, the draining
backend's memory and what the call returns, per-chunk time at the start, in the middle
and at the end of the job (from the commit times the audit records), the bytes of
history per item, and the time and WAL of pruning the finished job; and two
registrations a tenth the size, one before and one after the big one, for the time per
item at either size. Then register_job
with a jsonb list: the memory it takes, and what it hands back. With `removals`, a job
that deletes and one that moves that many rows to an archive, each row kept with the
audit: time, WAL and history per item.

Run by bench/run (or alone, against the cluster libpq finds through PGHOST/PGPORT):
    python bench/big_job.py [--items N] [--chunk N] [--jsonb-items N] [--out FILE]
It reports; it does not judge: tests/scale runs it smaller and asserts what must hold.
"""

import argparse
import json
import statistics
import threading
import time

import psycopg

from common import lsn, wal_since


def rss_anon_kb(pid):
    """The backend's private, anonymous memory (palloc'd contexts, Rust heap): what
    would grow if a registration or a chunk kept what it used. Shared buffers it touches
    are not counted."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return None


class Watch:
    """Samples a backend's private memory every 20 ms while a statement runs."""

    def __init__(self, pid):
        self.pid = pid
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            kb = rss_anon_kb(self.pid)
            if kb is not None:
                self.samples.append(kb)
            time.sleep(0.02)

    def __enter__(self):
        self.before = rss_anon_kb(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.after = rss_anon_kb(self.pid)

    @property
    def peak(self):
        return max(self.samples + [self.before, self.after])


def mb(kb):
    return round(kb / 1024, 1)


def chunk_times(c, audit, chunks, samples):
    """Each chunk's time, as the commit times the audit records tell it (one row a
    chunk): from one chunk's commit to the next one's."""
    commits = [
        r[0]
        for r in c.execute(
            f"SELECT extract(epoch FROM max(committed_at))::float8 FROM etc_batch.{audit} "
            "GROUP BY chunk ORDER BY chunk"
        ).fetchall()
    ]
    assert len(commits) == chunks, (len(commits), chunks)
    times = [b - a for a, b in zip(commits, commits[1:])]
    n = min(samples, len(times) // 3) or 1
    mid = len(times) // 2
    return {
        "chunk_ms_start": round(statistics.median(times[:n]) * 1000, 2),
        "chunk_ms_middle": round(statistics.median(times[mid - n // 2: mid - n // 2 + n]) * 1000, 2),
        "chunk_ms_end": round(statistics.median(times[-n:]) * 1000, 2),
        "end_over_start": round(statistics.median(times[-n:]) / statistics.median(times[:n]), 3),
        # the median chunk of each tenth of the job, to show the whole curve
        "chunk_ms_by_tenth": [
            round(statistics.median(times[k * len(times) // 10:(k + 1) * len(times) // 10]) * 1000, 2)
            for k in range(10)
        ],
    }


def measure(items=10_000_000, chunk=1000, jsonb_items=1_000_000, samples=200, db="bench_big",
            removals=0):
    """Runs the measurement and returns its numbers as a dict; with `removals`, also a
    delete and a move of that many rows (removal())."""
    with psycopg.connect("dbname=postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {db}")

    r = {"items": items, "chunk_size": chunk, "chunks": (items + chunk - 1) // chunk}
    with psycopg.connect(f"dbname={db}", autocommit=True, prepare_threshold=None) as c:
        c.add_notice_handler(lambda d: None)
        c.execute("CREATE EXTENSION etc_batch")
        c.execute(
            "CREATE TABLE orders (tenant text, id bigint, revision int NOT NULL DEFAULT 1, "
            "qty int, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))"
        )
        # tenant B's rows, with the same ids, must come out of it untouched
        c.execute(
            "INSERT INTO orders (tenant, id, qty) SELECT 'A', g, g %% 5 FROM generate_series(1, %s) g",
            (items,),
        )
        c.execute(
            "INSERT INTO orders (tenant, id, qty) SELECT 'B', g, g %% 5 FROM generate_series(1, %s) g",
            (max(items // 10, jsonb_items),),
        )
        c.execute("VACUUM ANALYZE orders")
        c.execute("CHECKPOINT")
        pid = c.info.backend_pid

        def register_tenth(job):
            """A job of a tenth of the items, from the same table: the time per item of
            a registration a tenth the size, to compare with the big one's."""
            t = time.perf_counter()
            c.execute(
                "SELECT * FROM etc_batch.register_job_from_query(%s, 'A', 'orders', "
                "$$SELECT id, revision, qty FROM orders WHERE tenant = 'A' AND id <= " + str(items // 10) + "$$, "
                "%s, '{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}')",
                (job, chunk),
            ).fetchone()
            return (time.perf_counter() - t) * 1e6 / (items // 10)

        tenth_before = register_tenth("tenth-before")
        since = lsn(c)
        t = time.perf_counter()
        with Watch(pid) as w:
            created = c.execute(
                "SELECT * FROM etc_batch.register_job_from_query('big', 'A', 'orders', "
                "$$SELECT id, revision, qty FROM orders WHERE tenant = 'A' AND status = 'pending'$$, "
                "%s, '{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}')",
                (chunk,),
            ).fetchone()
        seconds = time.perf_counter() - t
        r["register_wal_bytes_per_item"] = round(wal_since(c, since) / items, 1)
        tenth_after = register_tenth("tenth-after")
        r["tenth_register_us_per_item"] = [round(tenth_before, 2), round(tenth_after, 2)]
        r["register_per_item_over_tenth"] = round(
            seconds * 1e6 / items / ((tenth_before + tenth_after) / 2), 2)
        r["registered"] = list(created)
        r["register_seconds"] = round(seconds, 1)
        r["register_us_per_item"] = round(seconds * 1e6 / items, 2)
        r["register_rss_mb"] = {"before": mb(w.before), "peak": mb(w.peak), "after": mb(w.after)}

        number = c.execute("SELECT job_number FROM etc_batch.job WHERE job_id = 'big'").fetchone()[0]
        frozen = f"job_item_chunk_{number}"
        audit = f"job_audit_chunk_{number}"
        # the drain starts from a clean checkpoint, so that it does not pay for writing
        # out what loading and registering dirtied
        c.execute("CHECKPOINT")
        checkpoints = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        checkpoints_before = c.execute(checkpoints).fetchone()[0]
        since = lsn(c)
        t = time.perf_counter()
        with Watch(pid) as w:
            result = c.execute("CALL etc_batch.drain_job('big')").fetchone()
        seconds = time.perf_counter() - t
        r["drain_wal_bytes_per_item"] = round(wal_since(c, since) / items, 1)
        r["drain_result"] = list(result)
        r["drain_seconds"] = round(seconds, 1)
        r["drain_rows_per_s"] = round(items / seconds)
        r["drain_rss_mb"] = {"before": mb(w.before), "peak": mb(w.peak), "after": mb(w.after)}
        r["checkpoints_during_drain"] = c.execute(checkpoints).fetchone()[0] - checkpoints_before
        r.update(chunk_times(c, audit, r["chunks"], samples))

        once = c.execute(
            "SELECT count(*), count(DISTINCT position) FROM etc_batch.job_audit WHERE job_id = 'big'"
        ).fetchone()
        r["audit_rows"], r["audited_positions"] = once
        r["orders_changed_once"], r["orders_of_b_changed"] = c.execute(
            "SELECT count(*) FILTER (WHERE tenant = 'A' AND status = 'cancelled' AND revision = 2), "
            "count(*) FILTER (WHERE tenant = 'B' AND (status <> 'pending' OR revision <> 1)) FROM orders"
        ).fetchone()
        item_bytes, audit_bytes = c.execute(
            f"SELECT pg_total_relation_size('etc_batch.{frozen}'), "
            f"pg_total_relation_size('etc_batch.{audit}')"
        ).fetchone()
        r["history_bytes_per_item"] = {
            "job_item": round(item_bytes / items, 1),
            "job_audit": round(audit_bytes / items, 1),
            "total": round((item_bytes + audit_bytes) / items, 1),
        }

        since = lsn(c)
        t = time.perf_counter()
        pruned = c.execute("SELECT * FROM etc_batch.prune_history('1 microsecond')").fetchone()
        r["prune_seconds"] = round(time.perf_counter() - t, 3)
        r["prune_wal_bytes"] = wal_since(c, since)
        r["pruned"] = list(pruned)
        r["tables_left"] = c.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'etc_batch'::regnamespace "
            "AND relname IN (%s, %s)",
            (frozen, audit),
        ).fetchone()[0]

    if jsonb_items:
        r["jsonb"] = jsonb_registration(db, jsonb_items, chunk)
    if removals:
        r["removals"] = {action: removal(db, removals, chunk, action) for action in ("delete", "move")}
    with psycopg.connect("dbname=postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    return r


def removal(db, items, chunk, action):
    """A job that deletes `items` rows (action delete) or moves them to an archive table
    (action move), of a table of twice as many, registered from a query and drained by
    one call, every deleted row kept with the audit: its registration and drain in time
    and WAL per item, the draining backend's private memory, the history it keeps per
    item (the frozen list, and the audit with the rows kept), and that every row went
    exactly once."""
    with psycopg.connect(f"dbname={db}", autocommit=True, prepare_threshold=None) as c:
        c.add_notice_handler(lambda d: None)
        c.execute("DROP TABLE IF EXISTS events, events_archive")
        c.execute("CREATE TABLE events (id bigint PRIMARY KEY, at timestamptz NOT NULL, "
                  "status text NOT NULL, body text NOT NULL)")
        c.execute("INSERT INTO events SELECT g, timestamptz '2026-01-01' + g * interval '1 second', "
                  "CASE WHEN g %% 2 = 0 THEN 'old' ELSE 'new' END, md5(g::text) "
                  "FROM generate_series(1, %s) g", (2 * items,))
        c.execute("CREATE TABLE events_archive (LIKE events)")
        c.execute("VACUUM ANALYZE events")
        c.execute("CHECKPOINT")
        pid = c.info.backend_pid
        job = f"big-{action}"
        r = {"items": items}
        since = lsn(c)
        t = time.perf_counter()
        c.execute(
            "SELECT * FROM etc_batch.register_job_from_query(%s, NULL, 'events', "
            "$$SELECT id FROM events WHERE status = 'old'$$, %s, NULL, '{\"status\": \"old\"}', "
            "tenant_column => NULL, revision_column => NULL, guard => 'columns', action => %s, "
            "archive => %s)",
            (job, chunk, action, "events_archive" if action == "move" else None)).fetchone()
        r["register_seconds"] = round(time.perf_counter() - t, 1)
        r["register_wal_bytes_per_item"] = round(wal_since(c, since) / items, 1)
        c.execute("CHECKPOINT")
        since = lsn(c)
        t = time.perf_counter()
        with Watch(pid) as w:
            result = c.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
        seconds = time.perf_counter() - t
        r["drain_result"] = list(result)
        r["drain_seconds"] = round(seconds, 1)
        r["drain_rows_per_s"] = round(items / seconds)
        r["drain_wal_bytes_per_item"] = round(wal_since(c, since) / items, 1)
        r["drain_rss_mb"] = {"before": mb(w.before), "peak": mb(w.peak), "after": mb(w.after)}
        number = c.execute("SELECT job_number FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()[0]
        item_bytes, audit_bytes = c.execute(
            f"SELECT pg_total_relation_size('etc_batch.job_item_chunk_{number}'), "
            f"pg_total_relation_size('etc_batch.job_audit_chunk_{number}')").fetchone()
        r["history_bytes_per_item"] = {
            "job_item": round(item_bytes / items, 1),
            "job_audit_with_rows_kept": round(audit_bytes / items, 1),
        }
        r["left"], r["archived"], r["kept"] = c.execute(
            "SELECT (SELECT count(*) FROM events WHERE status = 'old'), "
            "(SELECT count(*) FROM events_archive), "
            "(SELECT count(k) FROM etc_batch.job_audit_chunk a, unnest(a.kept) k WHERE a.job_id = %s)",
            (job,)).fetchone()
        assert r["left"] == 0 and r["kept"] == items, r
        assert r["archived"] == (items if action == "move" else 0), r
        c.execute("DROP TABLE events, events_archive")
    return r


def jsonb_registration(db, items, chunk):
    """register_job with a jsonb list of `items` items, read from a table (as an
    approval kept for review would be): its time, and the registering backend's private
    memory before, at its peak and after the call."""
    with psycopg.connect(f"dbname={db}", autocommit=True, prepare_threshold=None) as c:
        c.add_notice_handler(lambda d: None)
        c.execute(
            "CREATE TABLE approval AS SELECT jsonb_agg(jsonb_build_object('id', id, "
            "'revision', revision, 'qty', qty)) AS items FROM orders WHERE tenant = 'B' AND id <= %s",
            (items,),
        )
        count = c.execute("SELECT jsonb_array_length(items) FROM approval").fetchone()[0]
    # a connection of its own, so that building the list above weighs nothing here
    with psycopg.connect(f"dbname={db}", autocommit=True, prepare_threshold=None) as c:
        c.add_notice_handler(lambda d: None)
        pid = c.info.backend_pid
        t = time.perf_counter()
        with Watch(pid) as w:
            created = c.execute(
                "SELECT * FROM etc_batch.register_job('from-jsonb', 'B', 'orders', "
                "(SELECT items FROM approval), %s, '{\"status\": \"cancelled\"}')",
                (chunk,),
            ).fetchone()
        seconds = time.perf_counter() - t
        return {
            "items": count,
            "registered": list(created),
            "seconds": round(seconds, 1),
            "rss_mb": {"before": mb(w.before), "peak": mb(w.peak), "after": mb(w.after)},
        }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=10_000_000)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--jsonb-items", type=int, default=1_000_000)
    ap.add_argument("--removals", type=int, default=0,
                    help="rows of a delete and of a move measured after the rest; 0 to skip")
    ap.add_argument("--db", default="bench_big")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    result = measure(a.items, a.chunk, a.jsonb_items, db=a.db, removals=a.removals)
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
