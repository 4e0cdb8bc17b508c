"""A 1,000,000-item job drained one chunk per call: registration time, per-chunk time
at the start, middle and end, and the draining backend's private memory.

Run by bench/run (or alone, against the cluster libpq finds through PGHOST/PGPORT):
    python bench/million_job.py [--items N] [--chunk N] [--out FILE]
It reports; it does not judge. Numbers go to stdout and, as JSON, to --out.
"""

import argparse
import json
import statistics
import time

import psycopg


def rss_anon_kb(pid):
    """The backend's private, anonymous memory (palloc'd contexts, Rust heap): what
    would grow if a chunk leaked. Shared buffers it touches are not counted."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return None


def checkpoints(c):
    """Checkpoints so far, and buffers the backends had to write out themselves to make
    room (shared_buffers full of dirty pages)."""
    return c.execute(
        "SELECT checkpoints_timed + checkpoints_req, buffers_backend FROM pg_stat_bgwriter"
    ).fetchone()


def measure(items=1_000_000, chunk=1000, samples=100, db="bench_million"):
    """Runs the measurement and returns its numbers as a dict."""
    a = argparse.Namespace(items=items, chunk=chunk, samples=samples, db=db)

    with psycopg.connect("dbname=postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {a.db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {a.db}")

    with psycopg.connect(f"dbname={a.db}", autocommit=True, prepare_threshold=None) as c:
        c.execute("CREATE EXTENSION etc_batch")
        c.execute(
            "CREATE TABLE orders (tenant text, id bigint, revision int NOT NULL DEFAULT 1, "
            "qty int, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))"
        )
        c.execute(
            "INSERT INTO orders (tenant, id, qty) SELECT 'A', g, g %% 5 FROM generate_series(1, %s) g",
            (a.items,),
        )
        c.execute("VACUUM ANALYZE orders")
        c.execute(
            "CREATE TABLE approval AS SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, "
            "'qty', qty)) AS items FROM orders"
        )
        pid = c.info.backend_pid
        rss_before_register = rss_anon_kb(pid)
        t = time.perf_counter()
        c.execute(
            "SELECT * FROM etc_batch.register_job('million', 'A', 'orders', (SELECT items FROM approval), "
            "%s, '{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}')",
            (a.chunk,),
        )
        register_s = time.perf_counter() - t
        rss_after_register = rss_anon_kb(pid)

        # The drain starts from a clean checkpoint, so that it does not pay for writing out
        # what loading and registering dirtied; checkpoints during the drain are counted.
        c.execute("CHECKPOINT")
        checkpoints_before = checkpoints(c)
        chunks = (a.items + a.chunk - 1) // a.chunk
        times, memory = [], []
        c.add_notice_handler(lambda d: None)
        for _ in range(chunks):
            t = time.perf_counter()
            c.execute("CALL etc_batch.drain_job('million', 1)")
            times.append(time.perf_counter() - t)
            memory.append(rss_anon_kb(pid))
        status = c.execute("SELECT status, next_index FROM etc_batch.job WHERE job_id = 'million'").fetchone()
        audited = c.execute("SELECT count(*) FROM etc_batch.job_audit WHERE job_id = 'million'").fetchone()[0]
        checkpoints_after = checkpoints(c)
        sizes = c.execute(
            "SELECT pg_size_pretty(sum(pg_total_relation_size(oid))) FROM pg_class "
            "WHERE relkind = 'r' AND relname IN ('orders', 'job_item', 'job_audit')"
        ).fetchone()[0]
        shared_buffers = c.execute("SHOW shared_buffers").fetchone()[0]

    n = min(a.samples, chunks // 3) or 1
    mid = chunks // 2
    start = statistics.median(times[:n])
    middle = statistics.median(times[mid - n // 2: mid - n // 2 + n])
    end = statistics.median(times[-n:])
    result = {
        "items": a.items,
        "chunk_size": a.chunk,
        "chunks": chunks,
        "register_seconds": round(register_s, 2),
        "chunk_ms_start": round(start * 1000, 2),
        "chunk_ms_middle": round(middle * 1000, 2),
        "chunk_ms_end": round(end * 1000, 2),
        "end_over_start": round(end / start, 3),
        # the median chunk of each tenth of the job, to show the whole curve
        "chunk_ms_by_tenth": [
            round(statistics.median(times[k * chunks // 10:(k + 1) * chunks // 10]) * 1000, 2)
            for k in range(10)
        ],
        "checkpoints_during_drain": checkpoints_after[0] - checkpoints_before[0],
        "buffers_written_by_backends_during_drain": checkpoints_after[1] - checkpoints_before[1],
        "tables_at_end": sizes,
        "shared_buffers": shared_buffers,
        "rss_anon_kb_before_register": rss_before_register,
        "rss_anon_kb_after_register": rss_after_register,
        "rss_anon_kb_after_first_chunk": memory[0],
        "rss_anon_kb_after_middle_chunk": memory[mid],
        "rss_anon_kb_after_last_chunk": memory[-1],
        "rss_anon_kb_peak": max(m for m in memory if m is not None),
        "final_status": status[0],
        "final_next_index": status[1],
        "audit_rows": audited,
    }
    with psycopg.connect("dbname=postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {a.db} WITH (FORCE)")
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--db", default="bench_million")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    result = measure(a.items, a.chunk, a.samples, a.db)
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
