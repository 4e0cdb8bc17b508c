"""etc_batch against what users would otherwise write, on the same data, in one run.

    bench/run            (starts its own cluster; see there)
    python bench/bench.py --orders 100000 --reps 5 --out bench/results

Drains: 100,000 pending orders of one tenant among 100,000 of another, approved as one
list, cancelled chunk by chunk with an audit row per order and a checkpoint per chunk:
  A  CALL etc_batch.drain_job, the approval registered from a query (timed separately)
  J  the same, the approval registered as a jsonb list the client sends (timed separately)
  T  A with its transactions sized by time: pace_job's transaction_time of 200 ms, as
     many chunks per COMMIT as fit it
  S  A with every signal of pace_job set and none tripping (replica lag, archive backlog,
     a VACUUM of the table, a window of the whole week, a throttle and a critical query)
  B  PL/pgSQL, the seed's way: one UPDATE ... RETURNING and one audit INSERT per item
  C  PL/pgSQL as a competent DBA writes it: per chunk the job row locked, one statement
     that reads the chunk's items, makes the guarded change and inserts the audit rows
     from what it returned, the count checked, the checkpoint moved, COMMIT
  D  a client loop in Python (psycopg 3), one statement per round trip
  E  the floor: one UPDATE and one audit INSERT for every row, no chunks, no checkpoint
  F  the bare chunked UPDATE a DBA writes when nobody asks for an audit: the next chunk
     of keys changed and committed, no frozen list, no checkpoint, no audit
For A, J and F also the WAL each writes per item, and for A and J what registering the
approval costs in time and WAL and the history the job keeps (its tables, indexes
included), per item: the safety tax, registration plus drain against F.
Chains: 10,000 trivial steps, CALL etc_batch.exec_batch_from_id against the seed's
PL/pgSQL procedure (LOCK TABLE, status check, COMMIT per step). Scale: a
10,000,000-item job registered from a query and drained by one call
(bench/big_job.py). Each kind of change (a delete, a move to an archive, a computed
backfill, a backfill from a join, a handler) against the PL/pgSQL keyset loop a DBA
writes for it, with an audit and without (bench/change_kinds.py).
Jobs on other tables: a row-digest job against the same job with a
revision column, and chunks on a never-analyzed table against the analyzed one
(bench/table_kinds.py). Launched workers against client sessions on a parallel job, and a
launch's time to its first chunk (bench/launches.py). The application's update latency, p50
and p99, without a drain, next to
an unpaced drain and next to a paced one (bench/app_latency.py). Concurrency, at chunk 100: 1, 2, 4, 8 drainers on a sequential job
each, 1 and 8 on one sequential job, 1, 2, 4, 8 on one parallel job, and the hand-written
loop C on a job of its own each for 1 and 2 sessions (what the machine allows several
sessions at once, whoever wrote the loop), in repetitions whose order turns.

This machine's speed wanders by tens of percent within minutes, so every repetition
runs every method once, back to back and each time in another order, and a ratio is the
median of the repetitions' own ratios: two methods are compared on the same stretch of
the machine's time.

Numbers go to stdout and to --out (JSON, Markdown, PNG), with each target of the
benchmark and whether this run met it.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import commit, connect, lsn, machine, summary, wal_since  # noqa: E402

CHUNKS = (10, 100, 1000)
METHODS = ("A", "T", "J", "S", "R", "B", "C", "D", "E", "F")
NAMES = {
    "A": "etc_batch.drain_job",
    "T": "etc_batch.drain_job, transaction_time 200 ms",
    "J": "etc_batch.drain_job, approved as jsonb",
    "S": "etc_batch.drain_job, every signal set, none tripping",
    "R": "etc_batch.drain_job, values before the change recorded (record_before)",
    "B": "PL/pgSQL per item",
    "C": "PL/pgSQL per chunk, one statement",
    "D": "Python client loop",
    "E": "one statement (floor)",
    "F": "bare chunked UPDATE, no audit",
}
# the methods whose WAL per item is measured, and those that register an approval
WAL_METHODS = ("A", "J", "F")
REGISTERING = ("A", "J")


def history_bytes(c):
    """What etc_batch's tables hold, indexes and TOAST included: before a job's
    registration and after its drain, the difference is the history the job keeps,
    whatever the layout."""
    return int(c.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_catalog.pg_class c "
        "WHERE c.relnamespace = 'etc_batch'::regnamespace AND c.relkind = 'r'").fetchone()[0])


def backend_cpu(conn):
    """CPU seconds the connection's server process has used so far (user + system), or
    None where /proc cannot tell: with the wall clock, it tells CPU from waiting."""
    try:
        stat = Path(f"/proc/{conn.info.backend_pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bench:
    def __init__(self, db, orders, client_orders=10_000):
        self.db = db
        self.orders = orders
        self.client_orders = client_orders

    # -- data --------------------------------------------------------------------------

    def setup(self):
        with connect("postgres") as c:
            c.execute(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {self.db}")
        with connect(self.db) as c:
            c.execute("CREATE EXTENSION etc_batch")
            c.execute((HERE / "alternatives.sql").read_text())

    def fresh_orders(self, c):
        """The same starting state for every run: tenant A's orders pending at revision 1,
        tenant B's beside them with the same ids, statistics fresh, no dead rows."""
        c.execute("DROP TABLE IF EXISTS orders")
        c.execute(
            "CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1, "
            "qty int NOT NULL, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))"
        )
        c.execute(
            "INSERT INTO orders (tenant, id, qty) SELECT t, g, 1 + g %% 5 "
            "FROM unnest(ARRAY['A', 'B']) t, generate_series(1, %s) g",
            (self.orders,),
        )
        c.execute("TRUNCATE alt.jobs, alt.job_items, alt.job_audit")
        c.execute("VACUUM ANALYZE orders")
        c.execute("CHECKPOINT")

    def check(self, c, expected=None):
        cancelled, wrong = c.execute(
            "SELECT count(*) FILTER (WHERE tenant = 'A' AND status = 'cancelled' AND revision = 2), "
            "count(*) FILTER (WHERE tenant = 'B' AND (status <> 'pending' OR revision <> 1)) FROM orders"
        ).fetchone()
        assert cancelled == (expected or self.orders) and wrong == 0, (cancelled, wrong)

    def alt_job(self, c, job, chunk, items=None):
        items = items or self.orders
        c.execute("INSERT INTO alt.jobs VALUES (%s, 'A', %s, %s, 0)", (job, chunk, items))
        c.execute(
            "INSERT INTO alt.job_items SELECT %s, row_number() OVER (ORDER BY id) - 1, id, revision, qty "
            "FROM orders WHERE tenant = 'A' AND id <= %s",
            (job, items),
        )
        c.execute("ANALYZE alt.job_items")

    # -- the drains --------------------------------------------------------------------

    def run(self, method, chunk, sync_commit):
        with connect(self.db) as c:
            self.fresh_orders(c)
            c.execute(f"SET synchronous_commit = {sync_commit}")
            job = f"{method}-{chunk}-{time.monotonic_ns()}"
            extra = {}
            if method in REGISTERING or method in ("S", "R", "T"):
                history = history_bytes(c)
                if method == "J":
                    # the list as a client sends it, put together before the clock starts
                    items = json.dumps([
                        {"id": i, "revision": rev, "qty": q} for i, rev, q in c.execute(
                            "SELECT id, revision, qty FROM orders WHERE tenant = 'A'")])
                since = lsn(c)
                t = time.perf_counter()
                if method in ("A", "S", "T"):
                    c.execute(
                        "SELECT etc_batch.register_job_from_query(%s, 'A', 'orders', "
                        "$$SELECT id, revision, qty FROM orders WHERE tenant = 'A'$$, %s, "
                        "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}')",
                        (job, chunk),
                    )
                elif method == "R":
                    # the values before are not the same for every row, so that no expect
                    # can say them: each row's status is recorded with its item instead
                    c.execute(
                        "SELECT etc_batch.register_job_from_query(%s, 'A', 'orders', "
                        "$$SELECT id, revision, qty FROM orders WHERE tenant = 'A'$$, %s, "
                        "'{\"status\": \"cancelled\"}', record_before => true)",
                        (job, chunk),
                    )
                else:
                    c.execute(
                        "SELECT etc_batch.register_job(%s, 'A', 'orders', %s::jsonb, %s, "
                        "'{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}')",
                        (job, items, chunk),
                    )
                extra["register_s"] = time.perf_counter() - t
                extra["register_wal"] = wal_since(c, since)
                if method == "T":
                    c.execute("SELECT etc_batch.pace_job(%s, transaction_time => '200ms')", (job,))
                if method == "S":
                    # what a careful DBA sets for a drain on a busy primary; none trips here
                    c.execute(
                        "SELECT etc_batch.pace_job(%s, max_replica_lag_bytes => 1024 * 1024 * 1024, "
                        "max_archive_backlog => 64, yield_to_vacuum => true, "
                        "windows => ARRAY['mon-sun 00:00-24:00'], "
                        "throttle_query => $$SELECT count(*) > 64 FROM pg_stat_activity "
                        "WHERE state = 'active'$$, "
                        "pause_above_replica_lag_bytes => 16 * 1024 * 1024 * 1024::bigint, "
                        "pause_above_archive_backlog => 1024, critical_query => 'SELECT pg_is_in_recovery()')",
                        (job,))
                cpu = backend_cpu(c)
                since = lsn(c)
                t = time.perf_counter()
                c.execute("CALL etc_batch.drain_job(%s)", (job,))
            elif method == "F":
                cpu = backend_cpu(c)
                since = lsn(c)
                t = time.perf_counter()
                c.execute("CALL alt.update_in_chunks('A', %s)", (chunk,))
            else:
                # D, at some 2,000 rows a second, drains the first client_orders of the list
                items = min(self.client_orders, self.orders) if method == "D" else self.orders
                self.alt_job(c, job, chunk, items)
                cpu = backend_cpu(c)
                t = time.perf_counter()
                if method == "B":
                    c.execute("CALL alt.drain_per_item(%s)", (job,))
                elif method == "C":
                    c.execute("CALL alt.drain_per_chunk(%s)", (job,))
                elif method == "E":
                    c.execute("CALL alt.drain_all_at_once(%s)", (job,))
                elif method == "D":
                    self.client_loop(job, sync_commit)
            seconds = time.perf_counter() - t
            if method in WAL_METHODS:
                extra["wal"] = wal_since(c, since)
            if method in REGISTERING:
                extra["history"] = history_bytes(c) - history
            rows = min(self.client_orders, self.orders) if method == "D" else self.orders
            # D's statements run in a connection of their own, and half of its work is the
            # client's: its server CPU says nothing comparable
            after = backend_cpu(c)
            if method != "D" and cpu is not None and after is not None:
                extra["cpu_us_per_row"] = (after - cpu) * 1e6 / rows
            self.check(c, rows)
        return {"rows_per_s": rows / seconds, "seconds": seconds, **extra}

    def client_loop(self, job, sync_commit):
        """How a service would write it: one statement per round trip."""
        with connect(self.db, autocommit=False) as c:
            c.execute(f"SET synchronous_commit = {sync_commit}")
            c.commit()
            while True:
                with c.transaction():
                    tenant, chunk, count, nxt = c.execute(
                        "SELECT tenant, chunk_size, item_count, next_index FROM alt.jobs "
                        "WHERE job_id = %s FOR UPDATE",
                        (job,),
                    ).fetchone()
                    if nxt >= count:
                        return
                    items = c.execute(
                        "SELECT position, id, revision, qty FROM alt.job_items "
                        "WHERE job_id = %s AND position >= %s AND position < %s ORDER BY position",
                        (job, nxt, nxt + chunk),
                    ).fetchall()
                    for position, oid, rev, qty in items:
                        row = c.execute(
                            "UPDATE orders SET status = 'cancelled', revision = revision + 1 "
                            "WHERE tenant = %s AND id = %s AND revision = %s AND qty = %s "
                            "AND status = 'pending' RETURNING revision",
                            (tenant, oid, rev, qty),
                        ).fetchone()
                        if row is None:
                            raise RuntimeError(f"conflict at {oid}")
                        c.execute(
                            "INSERT INTO alt.job_audit VALUES (%s, %s, %s, %s, %s, %s, %s, txid_current(), now())",
                            (job, position, oid, rev, row[0], qty, nxt // chunk + 1),
                        )
                    c.execute(
                        "UPDATE alt.jobs SET next_index = %s WHERE job_id = %s",
                        (min(nxt + chunk, count), job),
                    )

    # -- chains ------------------------------------------------------------------------

    def chains(self, steps, seed_first=False):
        out = {}
        with connect(self.db) as c:
            c.execute("TRUNCATE etc_batch.batch_log, alt.batch_log")
            c.execute(
                "SELECT etc_batch.add_step('bench', 'SELECT 1', g) FROM generate_series(1, %s) g", (steps,)
            )
            c.execute(
                "INSERT INTO alt.batch_log SELECT g, 'pending', 'SELECT 1' FROM generate_series(1, %s) g",
                (steps,),
            )
            c.execute("VACUUM ANALYZE etc_batch.batch_log")
            c.execute("VACUUM ANALYZE alt.batch_log")
            c.execute("CHECKPOINT")
            calls = [("A", "CALL etc_batch.exec_batch_from_id(1)"), ("seed", "CALL alt.exec_batch_from_id(1)")]
            for name, call in reversed(calls) if seed_first else calls:
                cpu = backend_cpu(c)
                t = time.perf_counter()
                c.execute(call)
                out[name] = steps / (time.perf_counter() - t)
                after = backend_cpu(c)
                if cpu is not None and after is not None:
                    out[name + "_cpu_us"] = (after - cpu) * 1e6 / steps
            done = c.execute(
                "SELECT (SELECT count(*) FROM etc_batch.batch_log WHERE status = 'done'), "
                "(SELECT count(*) FROM alt.batch_log WHERE status = 'done')"
            ).fetchone()
            assert done == (steps, steps), done
        return out

    # -- concurrency -------------------------------------------------------------------

    def concurrency(self, chunk, drainers, mode):
        """Rows per second of `drainers` concurrent drain_job calls over the orders:
        mode "separate", one sequential job each; "one_job", one sequential job for
        all; "parallel", one parallel job for all; "C separate", the hand-written loop C
        (alt.drain_per_chunk) on a job of its own each: what this machine allows
        several sessions at once, whoever wrote the loop."""
        with connect(self.db) as c:
            self.fresh_orders(c)
            jobs = []
            parts = drainers if mode in ("separate", "C separate") else 1
            size = self.orders // parts
            for k in range(parts):
                job = f"conc-{drainers}-{mode}-{k}-{time.monotonic_ns()}"
                jobs.append(job)
                if mode == "C separate":
                    c.execute("INSERT INTO alt.jobs VALUES (%s, 'A', %s, %s, 0)", (job, chunk, size))
                    c.execute(
                        "INSERT INTO alt.job_items SELECT %s, row_number() OVER (ORDER BY id) - 1, id, "
                        "revision, qty FROM orders WHERE tenant = 'A' AND id > %s AND id <= %s",
                        (job, k * size, (k + 1) * size),
                    )
                    continue
                c.execute(
                    "SELECT etc_batch.register_job_from_query(%s, 'A', 'orders', "
                    "format('SELECT id, revision, qty FROM orders WHERE tenant = %%L AND id > %%s AND id <= %%s', "
                    "'A', %s, %s), %s, '{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}', "
                    "parallel => %s)",
                    (job, k * size, (k + 1) * size, chunk, mode == "parallel"),
                )
            c.execute("ANALYZE alt.job_items")
        call = "CALL alt.drain_per_chunk(%s)" if mode == "C separate" else "CALL etc_batch.drain_job(%s)"
        barrier = threading.Barrier(drainers)
        errors = []

        def drain(job):
            try:
                with connect(self.db) as c:
                    barrier.wait(60)
                    c.execute(call, (job,))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=drain, args=(jobs[i % len(jobs)],)) for i in range(drainers)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        seconds = time.perf_counter() - t
        assert not errors, errors
        with connect(self.db) as c:
            self.check(c)
        return self.orders / seconds


def environment(db):
    with connect(db) as c:
        settings = dict(
            c.execute(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN "
                "('shared_buffers', 'synchronous_commit', 'fsync', 'wal_level', 'max_wal_size', "
                "'checkpoint_timeout', 'work_mem', 'full_page_writes', 'autovacuum')"
            ).fetchall()
        )
        version = c.execute("SHOW server_version").fetchone()[0]
    return {
        "machine": machine(),
        "postgres": version,
        "settings": settings,
        "commit": commit("src", "sql"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def paired(a_runs, other_runs):
    """The ratios of A to another method, repetition by repetition."""
    return summary([a / o for a, o in zip(a_runs, other_runs)])


def safety_tax(runs, items):
    """Per item, the medians of what A and J cost (registering, draining, both; time in
    µs and WAL in bytes; the history kept) and of what F costs, and the ratios of A's and
    J's registration plus drain to F, repetition by repetition. `runs`: method -> what
    each repetition measured."""
    def per_item(values, scale=1.0):
        return statistics.median(v * scale / items for v in values)

    out = {}
    for m, r in runs.items():
        row = {"us": per_item(r["seconds"], 1e6), "wal": per_item(r["wal"])}
        if "register_s" in r:
            row.update({
                "register_us": per_item(r["register_s"], 1e6),
                "register_wal": per_item(r["register_wal"]),
                "history": per_item(r["history"]),
                "total_us": statistics.median(
                    (x + y) * 1e6 / items for x, y in zip(r["register_s"], r["seconds"])),
                "total_wal": statistics.median(
                    (x + y) / items for x, y in zip(r["register_wal"], r["wal"])),
            })
            if "F" in runs:
                f = runs["F"]
                row["time_over_F"] = summary(
                    [(x + y) / z for x, y, z in zip(r["register_s"], r["seconds"], f["seconds"])])
                row["wal_over_F"] = summary(
                    [(x + y) / z for x, y, z in zip(r["register_wal"], r["wal"], f["wal"])])
        out[m] = row
    return out


# What the benchmark must show, each as (what, how it is read from the results, bound,
# whether the bound is a floor or a ceiling).
TARGETS = [
    ("A ≥ 1.0 × C at chunk 10", lambda r: r["ratios"]["on"]["10"]["C"]["median"], 1.0, "≥"),
    ("A ≥ 1.0 × C at chunk 100", lambda r: r["ratios"]["on"]["100"]["C"]["median"], 1.0, "≥"),
    ("A ≥ 1.0 × C at chunk 1,000", lambda r: r["ratios"]["on"]["1000"]["C"]["median"], 1.0, "≥"),
    ("T (transaction_time 200 ms) ≥ 2.0 × C at chunk 10",
     lambda r: r["by_time"]["on"]["10"]["over_c"]["median"], 2.0, "≥"),
    ("T (transaction_time 200 ms) ≥ 3.0 × A at chunk 10",
     lambda r: r["by_time"]["on"]["10"]["over_a"]["median"], 3.0, "≥"),
    ("T (transaction_time 200 ms) ≥ 1.5 × C at chunk 100",
     lambda r: r["by_time"]["on"]["100"]["over_c"]["median"], 1.5, "≥"),
    ("A ≥ 1.5 × B at chunk 1,000", lambda r: r["ratios"]["on"]["1000"]["B"]["median"], 1.5, "≥"),
    ("A ≥ 1.2 × B at chunk 10", lambda r: r["ratios"]["on"]["10"]["B"]["median"], 1.2, "≥"),
    ("A ≥ 0.85 × E at chunk 1,000", lambda r: r["ratios"]["on"]["1000"]["E"]["median"], 0.85, "≥"),
    *[(f"J (approved as jsonb) ≥ 1.0 × C at chunk {k:,}",
       (lambda key: lambda r: r["j_over_c"]["on"][key]["median"])(str(k)), 1.0, "≥") for k in CHUNKS],
    *[(f"{m}: registration plus drain ≤ 1.25 × the bare chunked UPDATE's time, chunk 1,000",
       (lambda m: lambda r: r["tax"]["on"]["1000"][m]["time_over_F"]["median"])(m), 1.25, "≤")
      for m in REGISTERING],
    *[(f"{m}: registration plus drain ≤ 1.5 × the bare chunked UPDATE's WAL, chunk 1,000",
       (lambda m: lambda r: r["tax"]["on"]["1000"][m]["wal_over_F"]["median"])(m), 1.5, "≤")
      for m in REGISTERING],
    *[(f"every signal set, none tripping ≥ 0.97 × no signals (S over A), chunk {k:,}",
       (lambda key: lambda r: r["signals_over_a"]["on"][key]["median"])(str(k)), 0.97, "≥")
      for k in (100, 1000)],
    ("history kept ≤ 40 bytes an item, chunk 1,000",
     lambda r: r["tax"]["on"]["1000"]["A"]["history"], 40, "≤"),
    # a third of 0.3.0's, measured at chunk 1,000 on this kind of machine: 7.0 µs an item
    *[(f"registration {how} ≤ 2.33 µs an item, chunk 1,000 (a third of 0.3.0's 7.0)",
       (lambda m: lambda r: r["tax"]["on"]["1000"][m]["register_us"])(m), 2.33, "≤")
      for m, how in (("A", "from a query"), ("J", "from a jsonb list"))],
    ("chains ≥ 1.1 × the seed's runner", lambda r: r["chains"]["ratio"]["median"], 1.1, "≥"),
    ("parallel job, chunk 100: 2 drainers ≥ 1.6 × 1 drainer",
     lambda r: r["concurrency"]["ratios"]["parallel 2 / 1"]["median"], 1.6, "≥"),
    ("parallel job, chunk 100: 8 drainers ≥ 1.0 × 2 drainers",
     lambda r: r["concurrency"]["ratios"]["parallel 8 / 2"]["median"], 1.0, "≥"),
    ("parallel job, chunk 100, one drainer: time per chunk ≤ 1.1 × a sequential job's",
     lambda r: r["concurrency"]["ratios"]["sequential 1 / parallel 1"]["median"], 1.1, "≤"),
    ("row-digest job ≥ 0.9 × the same job with a revision column, chunk 100",
     lambda r: r["tables"]["digest"]["100"]["ratio"]["median"], 0.9, "≥"),
    ("row-digest job ≥ 0.9 × the same job with a revision column, chunk 1,000",
     lambda r: r["tables"]["digest"]["1000"]["ratio"]["median"], 0.9, "≥"),
    ("chunk of 5,000 on a never-analyzed table ≤ 1.2 × on the analyzed table",
     lambda r: r["tables"]["statistics"]["ratio"]["median"], 1.2, "≤"),
    *[(f"{kind}: registration plus drain ≥ 1.0 × the hand-written loop with an audit, chunk {chunk:,}",
       (lambda kind, key: lambda r: r["kinds"][kind][key]["over_by_hand"]["median"])(kind, str(chunk)),
       1.0, "≥")
      for kind in ("delete", "move", "expressions", "from_query", "handler") for chunk in (100, 1000)],
    *[(f"{n} launched worker{'s' if n > 1 else ''} ≥ 0.95 × {n} client session{'s' if n > 1 else ''}, "
       f"parallel job, chunk {chunk:,}",
       (lambda key: lambda r: r["launches"]["ratios"][key]["median"])(f"{chunk}/{n}"), 0.95, "≥")
      for chunk in (100, 1000) for n in (1, 2, 4)],
    *[(f"2 launched workers ≥ 0.95 × 2 client sessions, parallel job, chunk 100, {int(size):,} orders",
       (lambda size: lambda r: r["launch_sizes"][size]["ratio"]["median"])(size), 0.95, "≥")
      for size in ("30000", "200000")],
    ("big job: per-chunk time at the end ≤ 1.2 × the start",
     lambda r: r["scale"]["end_over_start"], 1.2, "≤"),
    ("big job: registration time per item over a tenth-size job's",
     lambda r: r["scale"]["register_per_item_over_tenth"], 1.1, "≤"),
    ("big job: registration's private memory, peak over before, MB",
     lambda r: r["scale"]["register_rss_mb"]["peak"] - r["scale"]["register_rss_mb"]["before"], 64, "≤"),
    ("big job: the draining call's private memory, peak over before, MB",
     lambda r: r["scale"]["drain_rss_mb"]["peak"] - r["scale"]["drain_rss_mb"]["before"], 16, "≤"),
    ("register_job of 1,000,000 jsonb items: the backend's private memory at its peak, MB",
     lambda r: r["scale"]["jsonb"]["rss_mb"]["peak"], 200, "≤"),
    ("register_job of 1,000,000 jsonb items: memory kept after the call, MB",
     lambda r: r["scale"]["jsonb"]["rss_mb"]["after"] - r["scale"]["jsonb"]["rss_mb"]["before"], 16, "≤"),
]


def targets(r):
    """Each target with what this run measured and whether it met it."""
    out = []
    for what, read, bound, sense in TARGETS:
        try:
            value = read(r)
        except (KeyError, TypeError):
            continue
        met = value >= bound if sense == "≥" else value <= bound
        out.append({"target": what, "measured": round(value, 2), "met": met})
    return out


def markdown(r):
    env = r["environment"]
    lines = [
        f"Measured {env['date']} on {env['machine']}; PostgreSQL {env['postgres']}; commit {env['commit']}.",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in sorted(env["settings"].items())) + ".",
        f"{r['orders']:,} orders of one tenant among {r['orders']:,} of another; {r['reps']} repetitions, "
        "each running every method once, back to back, in an order that turns from one repetition to "
        f"the next. D drains the first {r['client_orders']:,} orders of the same list (a client loop "
        "at a few thousand rows a second would take most of the run); every session runs with "
        "client_min_messages at its default, notice, and etc_batch.progress_interval at its "
        "default, 1 s.",
        "",
    ]
    for sync in r["drains"]:
        table = r["drains"][sync]
        lines += [f"**synchronous_commit = {sync}**: rows per second, median (min to max)", ""]
        lines.append("| method | " + " | ".join(f"chunk {k:,}" for k in CHUNKS) + " |")
        lines.append("|---|" + "---|" * len(CHUNKS))
        for m in METHODS:
            if m not in table[str(CHUNKS[0])]:
                continue
            cells = []
            for k in CHUNKS:
                x = table[str(k)][m]
                cells.append(f"{x['median']:,.0f} ({x['min']:,.0f} to {x['max']:,.0f})")
            lines.append(f"| {m}: {NAMES[m]} | " + " | ".join(cells) + " |")
        lines.append("")
        ratios = r["ratios"].get(sync)
        shown = ("J", "B", "C", "D", "E", "F")
        if ratios and any(o in ratios[str(CHUNKS[0])] for o in shown):
            lines.append("A's rows per second over each other method's, the median of the repetitions' "
                         "own ratios (min to max):")
            lines.append("")
            lines.append("| ratio | " + " | ".join(f"chunk {k:,}" for k in CHUNKS) + " |")
            lines.append("|---|" + "---|" * len(CHUNKS))
            for other in shown:
                if other not in ratios[str(CHUNKS[0])]:
                    continue
                cells = []
                for k in CHUNKS:
                    x = ratios[str(k)][other]
                    cells.append(f"{x['median']:.2f}" + (f" ({x['min']:.2f} to {x['max']:.2f})" if len(x["runs"]) > 1 else ""))
                lines.append(f"| A / {other} | " + " | ".join(cells) + " |")
            lines.append("")
        by_time = r.get("by_time", {}).get(sync)
        if by_time:
            def spread(x):
                return f"{x['median']:.2f}" + (
                    f" ({x['min']:.2f} to {x['max']:.2f})" if len(x["runs"]) > 1 else "")
            lines += ["Transactions sized by time: T's rows per second (pace_job's transaction_time "
                      "200 ms, as many chunks per COMMIT as fit it) over C's and over A's (one chunk "
                      "per transaction), the median of the repetitions' own ratios (min to max):", "",
                      "| ratio | " + " | ".join(f"chunk {k:,}" for k in CHUNKS) + " |",
                      "|---|" + "---|" * len(CHUNKS),
                      "| T / C | " + " | ".join(spread(by_time[str(k)]["over_c"]) for k in CHUNKS) + " |"]
            if "over_a" in by_time[str(CHUNKS[0])]:
                lines.append("| T / A | " + " | ".join(spread(by_time[str(k)]["over_a"]) for k in CHUNKS) + " |")
            lines.append("")
        signals = r.get("signals_over_a", {}).get(sync)
        if signals:
            cells = [f"{signals[str(k)]['median']:.3f}"
                     + (f" ({signals[str(k)]['min']:.3f} to {signals[str(k)]['max']:.3f})"
                        if len(signals[str(k)]["runs"]) > 1 else "") for k in CHUNKS]
            lines += ["The signals' cost: S's rows per second over A's (every signal of pace_job "
                      "set, none tripping, read at most once per etc_batch.signal_interval, 1 s), "
                      "the median of the repetitions' own ratios (min to max):", "",
                      "| ratio | " + " | ".join(f"chunk {k:,}" for k in CHUNKS) + " |",
                      "|---|" + "---|" * len(CHUNKS),
                      "| S / A | " + " | ".join(cells) + " |", ""]
        recorded = r.get("record_before", {}).get(sync)
        if recorded:
            def spread(x, digits=3):
                return f"{x['median']:.{digits}f}" + (
                    f" ({x['min']:.{digits}f} to {x['max']:.{digits}f})" if len(x["runs"]) > 1 else "")
            lines += ["The cost of record_before: R (each row's status recorded with its item at "
                      "registration and guarded) against A (the status before named once, by "
                      "expect); the median of the repetitions' own ratios (min to max), and each "
                      "one's registration in microseconds an item:", "",
                      "| | " + " | ".join(f"chunk {k:,}" for k in CHUNKS) + " |",
                      "|---|" + "---|" * len(CHUNKS),
                      "| drain, R / A rows per second | "
                      + " | ".join(spread(recorded[str(k)]["drain_over_a"]) for k in CHUNKS) + " |",
                      "| registration, R / A time | "
                      + " | ".join(spread(recorded[str(k)]["register_over_a"]) for k in CHUNKS) + " |",
                      "| registration, A, µs an item | "
                      + " | ".join(f"{recorded[str(k)]['register_us']['A']['median']:.2f}" for k in CHUNKS) + " |",
                      "| registration, R, µs an item | "
                      + " | ".join(f"{recorded[str(k)]['register_us']['R']['median']:.2f}" for k in CHUNKS) + " |",
                      ""]
        cpu = r.get("cpu", {}).get(sync)
        if cpu and all("A" in cpu[str(k)] for k in CHUNKS):
            lines.append(
                "Server CPU per row, in microseconds (median; the backend's user + system time "
                "from /proc, which with fsync on includes the WAL flush of each COMMIT):"
            )
            lines.append("")
            lines.append("| method | " + " | ".join(f"chunk {k:,}" for k in CHUNKS) + " |")
            lines.append("|---|" + "---|" * len(CHUNKS))
            for m in ("A", "S", "R", "B", "C", "E"):
                if all(m in cpu[str(k)] for k in CHUNKS):
                    cells = [f"{cpu[str(k)][m]['median']:.1f}" for k in CHUNKS]
                    lines.append(f"| {m}: {NAMES[m]} | " + " | ".join(cells) + " |")
            lines.append("")
    tax = r.get("tax", {}).get("on")
    if tax:
        lines += [
            "**The safety tax**, synchronous_commit = on, per item (medians): the time in µs and "
            "the WAL in bytes of registering the approval (A from a query, J from a jsonb list "
            "the client sends) and of draining it, the history the job keeps (its tables, "
            "indexes included), and registration plus drain over F, the bare chunked UPDATE, "
            "the median of the repetitions' own ratios:",
            "",
            "| chunk | method | register µs | drain µs | total µs | register WAL | drain WAL "
            "| total WAL | history | time / F | WAL / F |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for k in CHUNKS:
            for m in WAL_METHODS:
                x = tax.get(str(k), {}).get(m)
                if not x:
                    continue
                if m in REGISTERING:
                    ratios = [f"{x[q]['median']:.2f}" if q in x else "" for q in ("time_over_F", "wal_over_F")]
                    lines.append(
                        f"| {k:,} | {m} | {x['register_us']:.1f} | {x['us']:.1f} | {x['total_us']:.1f} "
                        f"| {x['register_wal']:.0f} | {x['wal']:.0f} | {x['total_wal']:.0f} "
                        f"| {x['history']:.0f} | " + " | ".join(ratios) + " |")
                else:
                    lines.append(f"| {k:,} | {m} | | {x['us']:.1f} | {x['us']:.1f} | | {x['wal']:.0f} "
                                 f"| {x['wal']:.0f} | | | |")
        lines.append("")
    ch = r.get("chains")
    if ch:
        lines += [
            f"**Chains**, {r['steps']:,} trivial steps: etc_batch.exec_batch_from_id {ch['A']['median']:,.0f} steps/s, "
            f"the seed's PL/pgSQL procedure {ch['seed']['median']:,.0f} steps/s (medians); ratio, the median of the "
            f"repetitions' own, {ch['ratio']['median']:.2f} ({ch['ratio']['min']:.2f} to {ch['ratio']['max']:.2f})"
            + (
                f"; server CPU per step {ch['A_cpu_us']['median']:.0f} µs against {ch['seed_cpu_us']['median']:.0f} µs."
                if "A_cpu_us" in ch and "seed_cpu_us" in ch
                else "."
            ),
            "",
        ]
    sc = r.get("scale")
    if sc:
        lines += [
            f"**A {sc['items']:,}-item job** registered from a query and drained by one call, chunk "
            f"{sc['chunk_size']:,}: registration {sc['register_seconds']} s ({sc['register_us_per_item']} µs "
            f"an item, {sc.get('register_wal_bytes_per_item', '?')} bytes of WAL an item), the registering backend's private memory {sc['register_rss_mb']['before']} MB before, "
            f"{sc['register_rss_mb']['peak']} MB at its peak, {sc['register_rss_mb']['after']} MB after "
            f"(jobs a tenth the size, registered before and after it: "
            f"{' and '.join(str(v) for v in sc['tenth_register_us_per_item'])} µs an item, so "
            f"{sc['register_per_item_over_tenth']} × as much per item at the full size); "
            f"the drain {sc['drain_seconds']} s ({sc['drain_rows_per_s']:,} rows/s, "
            f"{sc.get('drain_wal_bytes_per_item', '?')} bytes of WAL an item), its memory "
            f"{sc['drain_rss_mb']['before']} MB before and {sc['drain_rss_mb']['peak']} MB at its peak, "
            f"returning {sc['drain_result']}; per chunk {sc['chunk_ms_start']} ms at the start, "
            f"{sc['chunk_ms_middle']} ms in the middle, {sc['chunk_ms_end']} ms at the end (end / start "
            f"{sc['end_over_start']}; the median chunk of each tenth: "
            + ", ".join(str(v) for v in sc["chunk_ms_by_tenth"])
            + f" ms; {sc['checkpoints_during_drain']} checkpoints during the drain); history "
            f"{sc['history_bytes_per_item']['total']} bytes an item (job_item "
            f"{sc['history_bytes_per_item']['job_item']}, job_audit {sc['history_bytes_per_item']['job_audit']}, "
            f"indexes included); pruned in {sc['prune_seconds']} s with {sc['prune_wal_bytes']:,} bytes of WAL.",
            "",
        ]
        js = sc.get("jsonb")
        if js:
            lines += [
                f"register_job with a jsonb list of {js['items']:,} items: {js['seconds']} s, the backend's "
                f"private memory {js['rss_mb']['before']} MB before, {js['rss_mb']['peak']} MB at its peak, "
                f"{js['rss_mb']['after']} MB after.",
                "",
            ]
        for action, rm in sc.get("removals", {}).items():
            lines += [
                f"A job that {'deletes' if action == 'delete' else 'moves to an archive'} {rm['items']:,} "
                f"rows of {2 * rm['items']:,}, each kept with the audit: registration {rm['register_seconds']} s "
                f"({rm['register_wal_bytes_per_item']} bytes of WAL an item), drain {rm['drain_seconds']} s "
                f"({rm['drain_rows_per_s']:,} rows/s, {rm['drain_wal_bytes_per_item']} bytes of WAL an item, "
                f"the backend's private memory {rm['drain_rss_mb']['before']} MB before and "
                f"{rm['drain_rss_mb']['peak']} MB at its peak); history per item: frozen list "
                f"{rm['history_bytes_per_item']['job_item']} bytes, audit with the rows kept "
                f"{rm['history_bytes_per_item']['job_audit_with_rows_kept']} bytes.",
                "",
            ]
    co = r.get("concurrency")
    if co:
        lines.append(
            f"**Concurrency**, chunk {co['chunk']}, rows per second in all, the median of "
            f"{co['reps']} repetitions (each runs every row once, in a turning order): drainers on "
            "a sequential job each, on one sequential job, and on one parallel job:")
        lines.append("")
        lines.append("| drainers | separate jobs | one job | one parallel job | C, separate jobs |")
        lines.append("|---|---|---|---|---|")

        def cell(mode, d):
            runs = co[mode].get(str(d))
            return "" if runs is None else f"{statistics.median(runs):,.0f}"

        for d in co["drainers"]:
            lines.append(f"| {d} | {cell('separate', d)} | {cell('one_job', d)} | {cell('parallel', d)} "
                         f"| {cell('C separate', d)} |")
        lines.append("")
        lines.append("Two drainers over one drainer, the median of the repetitions' own ratios: " + ", ".join(
            f"{name} {v['median']:.2f} ({v['min']:.2f} to {v['max']:.2f})" for name, v in co["ratios"].items()
        ) + ".")
        lines.append("")
    tb = r.get("tables")
    if tb:
        lines += [
            f"**Jobs on other tables**, {tb['reps']} repetitions, the two kinds back to back in a turning "
            f"order. The same {tb['orders']:,} orders of one tenant among as many of another, in a table "
            "with a revision column and in one without (the job guards each row by a digest of it, "
            "taken at registration and again for every row a chunk changes): rows per second, median "
            "(min to max):",
            "",
            "| chunk | revision column | row digest | digest / revision |",
            "|---|---|---|---|",
        ]
        for chunk, d in tb["digest"].items():
            lines.append(
                f"| {int(chunk):,} | {d['revision']['median']:,.0f} ({d['revision']['min']:,.0f} to "
                f"{d['revision']['max']:,.0f}) | {d['row']['median']:,.0f} ({d['row']['min']:,.0f} to "
                f"{d['row']['max']:,.0f}) | {d['ratio']['median']:.2f} ({d['ratio']['min']:.2f} to "
                f"{d['ratio']['max']:.2f}) |")
        st = tb["statistics"]
        lines += [
            "",
            f"A table of {st['rows']:,} rows loaded and never analyzed, and the same analyzed: a job of "
            f"{st['items']:,} of its rows in chunks of {st['chunk']:,}, milliseconds per chunk, median "
            f"(min to max): never analyzed {st['never_ms']['median']:.1f} ({st['never_ms']['min']:.1f} to "
            f"{st['never_ms']['max']:.1f}), analyzed {st['analyzed_ms']['median']:.1f} "
            f"({st['analyzed_ms']['min']:.1f} to {st['analyzed_ms']['max']:.1f}); ratio "
            f"{st['ratio']['median']:.2f} ({st['ratio']['min']:.2f} to {st['ratio']['max']:.2f}).",
            "",
        ]
    kd = r.get("kinds")
    if kd:
        lines += [
            f"**Kinds of change**, {kd['reps']} repetitions, the four back to back in a turning order: "
            f"{kd['rows']:,} old rows of a table of {2 * kd['rows']:,}, deleted, moved, backfilled "
            "(computed, from a join) or handed to a function, by etc_batch (registration from a query "
            "and drain, timed together), by the PL/pgSQL keyset loop a DBA writes with an audit row per "
            "row (what it was: a deleted row's whole content, a changed column's value), and by the same "
            "loop without the audit. Rows per second, median; etc_batch over each, the median of the "
            "repetitions' own ratios (min to max); WAL bytes per row, median. Beside them the floor "
            "(bench/change_kinds.py): the least plain SQL that freezes the approved list at "
            "registration and changes, guarded, and keeps a chunk of it at a time, with nothing else "
            "etc_batch does; floor over by hand is the most any registration plus drain of a frozen "
            "list reaches against the loop:",
            "",
            "| kind | chunk | etc_batch | by hand | bare | floor | over by hand | over bare | "
            "floor over by hand | over floor | WAL etc_batch / by hand / bare |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for kind in ("delete", "move", "expressions", "from_query", "handler"):
            for chunk, d in kd.get(kind, {}).items():
                rate, wal = d["rows_per_s"], d["wal_per_row"]
                lines.append(
                    f"| {kind} | {int(chunk):,} | {rate['etc_batch']['median']:,.0f} | "
                    f"{rate['by hand']['median']:,.0f} | {rate['bare']['median']:,.0f} | "
                    f"{rate['floor']['median']:,.0f} | "
                    f"{d['over_by_hand']['median']:.2f} ({d['over_by_hand']['min']:.2f} to "
                    f"{d['over_by_hand']['max']:.2f}) | {d['over_bare']['median']:.2f} "
                    f"({d['over_bare']['min']:.2f} to {d['over_bare']['max']:.2f}) | "
                    f"{d['floor_over_by_hand']['median']:.2f} ({d['floor_over_by_hand']['min']:.2f} to "
                    f"{d['floor_over_by_hand']['max']:.2f}) | {d['over_floor']['median']:.2f} "
                    f"({d['over_floor']['min']:.2f} to {d['over_floor']['max']:.2f}) | "
                    f"{wal['etc_batch']['median']:,.0f} / {wal['by hand']['median']:,.0f} / "
                    f"{wal['bare']['median']:,.0f} |")
        lines.append("")
    la = r.get("launches")
    if la:
        lines += [
            f"**Launched workers against client sessions**, {la['orders']:,} orders of one tenant, one "
            f"parallel job, {la['reps']} repetitions, the two back to back in a turning order: rows per "
            "second, median (the launch's by the server's clock, from launch_job returning, its workers "
            "connected, to the launch done; the sessions' by the client's, from all of them released at "
            "once to the last call returning):",
            "",
            "| chunk | drainers | client sessions | launched workers | workers / sessions |",
            "|---|---|---|---|---|",
        ]
        for key, ratio in la["ratios"].items():
            chunk, n = key.split("/")
            lines.append(
                f"| {int(chunk):,} | {n} | {la['sessions'][key]['median']:,.0f} | {la['workers'][key]['median']:,.0f} "
                f"| {ratio['median']:.2f} ({ratio['min']:.2f} to {ratio['max']:.2f}) |")
        fc = la["first_chunk_ms"]
        lines += [
            "",
            f"From launch_job returning to the launch's first chunk committed: median {fc['median']} ms, "
            f"p99 {fc['p99']} ms ({fc['launches']} launches).",
            "",
        ]
    ls = r.get("launch_sizes")
    if ls:
        first = next(iter(ls.values()))
        lines += [
            f"**Launched workers against client sessions by the size of the job**: {first['drainers']} "
            f"of each on one parallel job, chunk {first['chunk']}, {first['reps']} repetitions in a "
            "turning order: rows per second, median (the launch's by the server's clock, from "
            "launch_job returning to the launch done, its fixed start and end included; the "
            "sessions' by the client's, from all of them released at once to the last call "
            "returning), and workers over sessions, the median of the repetitions' own ratios "
            "(min to max):",
            "",
            "| orders | client sessions | launched workers | workers / sessions |",
            "|---|---|---|---|",
        ]
        for size, m in ls.items():
            ratio = m["ratio"]
            lines.append(
                f"| {int(size):,} | {m['sessions']['median']:,.0f} | {m['workers']['median']:,.0f} "
                f"| {ratio['median']:.2f} ({ratio['min']:.2f} to {ratio['max']:.2f}) |")
        lines.append("")
    al = r.get("app_latency")
    if al:
        lines += [
            f"**The application next to a drain**: {al['sessions']} sessions updating single rows of the "
            f"drained table in autocommit, a random row each time, a quarter of them items of the job; "
            f"the job {al['items']:,} items in chunks of {al['chunk']:,}, paced at "
            f"{al['paced_rows_per_second']:,} rows per second, a fifth of the unpaced drain's rate:",
            "",
            "| the application's updates | p50 ms | p99 ms | updates/s | the drain's rows/s |",
            "|---|---|---|---|---|",
        ]
        for key, name in (("without", "without a drain"), ("unpaced", "with an unpaced drain"),
                          ("paced", "with a paced drain")):
            x = al[key]
            drain = f"{x['drain_rows_per_s']:,}" if x["drain_rows_per_s"] else ""
            lines.append(f"| {name} | {x['p50_ms']:.2f} | {x['p99_ms']:.2f} | {x['updates_per_s']:,} | {drain} |")
        lines.append("")
    if r.get("targets"):
        lines += ["**Targets**", "", "| target | measured | |", "|---|---|---|"]
        for t in r["targets"]:
            lines.append(f"| {t['target']} | {t['measured']} | {'met' if t['met'] else 'missed'} |")
        lines.append("")
    return "\n".join(lines)


def plot(r, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    table = r["drains"]["on"]
    for m in METHODS:
        y = [table[str(k)][m]["median"] for k in CHUNKS]
        lo = [table[str(k)][m]["median"] - table[str(k)][m]["min"] for k in CHUNKS]
        hi = [table[str(k)][m]["max"] - table[str(k)][m]["median"] for k in CHUNKS]
        ax.errorbar(CHUNKS, y, yerr=[lo, hi], marker="o", capsize=3, label=f"{m}: {NAMES[m]}")
    ax.set_xscale("log")
    ax.set_xticks(CHUNKS, [f"{k:,}" for k in CHUNKS])
    ax.set_xlabel("chunk size")
    ax.set_ylabel("rows per second")
    ax.set_title(f"Draining {r['orders']:,} approved orders (synchronous_commit = on)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orders", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--client-orders", type=int, default=10_000,
                    help="orders D drains (the first of the same list): a client loop is slow")
    ap.add_argument("--big", type=int, default=10_000_000, help="items of the big job; 0 to skip")
    ap.add_argument("--concurrency", type=int, default=1, help="0 to skip the concurrency runs")
    ap.add_argument("--concurrency-reps", type=int, default=5)
    ap.add_argument("--launches", type=int, default=1,
                    help="0 to skip launched workers against client sessions")
    ap.add_argument("--launch-reps", type=int, default=5)
    ap.add_argument("--launch-sizes", default="30000,200000",
                    help="orders at which 2 workers and 2 sessions drain one job, chunk 100; empty to skip")
    ap.add_argument("--launch-size-reps", type=int, default=21,
                    help="a launch of 30,000 orders takes a fifth of a second: many repetitions")
    ap.add_argument("--tables", type=int, default=1,
                    help="0 to skip the runs on other kinds of table (row digests, statistics)")
    ap.add_argument("--kinds", type=int, default=1,
                    help="0 to skip each kind of change against the hand-written loops")
    ap.add_argument("--app-seconds", type=int, default=5,
                    help="the application's latency without a drain is measured this long; 0 to skip")
    ap.add_argument("--db", default="bench")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--only", default=None, help="comma-separated methods to run (default all)")
    ap.add_argument("--chunks", default=None,
                    help="comma-separated chunk sizes of the drains (default 10,100,1000)")
    a = ap.parse_args()
    if a.chunks:
        global CHUNKS
        CHUNKS = tuple(int(k) for k in a.chunks.split(","))

    methods = a.only.split(",") if a.only else list(METHODS)
    b = Bench(a.db, a.orders, a.client_orders)
    b.setup()
    result = {"orders": a.orders, "client_orders": min(a.client_orders, a.orders), "reps": a.reps,
              "steps": a.steps, "drains": {}, "ratios": {}, "environment": environment(a.db)}
    taxed = {}
    for sync, reps in (("on", a.reps), ("off", 1)):
        runs = {str(k): {m: [] for m in methods} for k in CHUNKS}
        cpu = {str(k): {m: [] for m in methods} for k in CHUNKS}
        registered = {str(k): {"A": [], "R": []} for k in CHUNKS}
        for rep in range(reps):
            # the order turns, so that no method always runs first or after another
            order = methods[rep % len(methods):] + methods[:rep % len(methods)]
            for k in CHUNKS:
                for m in order:
                    r = b.run(m, k, sync)
                    runs[str(k)][m].append(r["rows_per_s"])
                    if "cpu_us_per_row" in r:
                        cpu[str(k)][m].append(r["cpu_us_per_row"])
                    if m in ("A", "R"):
                        registered[str(k)][m].append(r["register_s"] * 1e6 / a.orders)
                    if m in WAL_METHODS:
                        kept = taxed.setdefault(sync, {}).setdefault(str(k), {}).setdefault(m, {})
                        for key in ("seconds", "wal", "register_s", "register_wal", "history"):
                            if key in r:
                                kept.setdefault(key, []).append(r[key])
                    print(f"sync={sync} rep={rep + 1} chunk={k} {m}: {r['rows_per_s']:,.0f} rows/s", flush=True)
        result["drains"][sync] = {k: {m: summary(v) for m, v in ms.items()} for k, ms in runs.items()}
        if "A" in methods:
            result["ratios"][sync] = {
                k: {o: paired(ms["A"], ms[o]) for o in methods if o != "A"} for k, ms in runs.items()
            }
        if "J" in methods and "C" in methods:
            result.setdefault("j_over_c", {})[sync] = {
                k: paired(ms["J"], ms["C"]) for k, ms in runs.items()}
        if "T" in methods and "C" in methods:
            # transactions sized by time, over the hand-written loop and over one chunk
            # per transaction
            result.setdefault("by_time", {})[sync] = {
                k: {"over_c": paired(ms["T"], ms["C"]),
                    **({"over_a": paired(ms["T"], ms["A"])} if "A" in ms else {})}
                for k, ms in runs.items()}
        if "S" in methods and "A" in methods:
            result.setdefault("signals_over_a", {})[sync] = {
                k: paired(ms["S"], ms["A"]) for k, ms in runs.items()}
        if "R" in methods and "A" in methods:
            # the drain's rows per second, R over A; and each one's registration, in
            # microseconds an item
            result.setdefault("record_before", {})[sync] = {
                k: {"drain_over_a": paired(ms["R"], ms["A"]),
                    "register_us": {m: summary(v) for m, v in registered[k].items()},
                    "register_over_a": paired(registered[k]["R"], registered[k]["A"])}
                for k, ms in runs.items()}
        result.setdefault("cpu", {})[sync] = {
            k: {m: summary(v) for m, v in ms.items() if v} for k, ms in cpu.items()
        }
    result["tax"] = {sync: {k: safety_tax(ms, a.orders) for k, ms in chunks.items()}
                     for sync, chunks in taxed.items()}

    if a.steps:
        chains = {"A": [], "seed": [], "A_cpu_us": [], "seed_cpu_us": []}
        for rep in range(a.reps):
            c = b.chains(a.steps, seed_first=rep % 2 == 1)
            for k in chains:
                if k in c:
                    chains[k].append(c[k])
            print(f"chains rep={rep + 1}: A {c['A']:,.0f} steps/s, seed {c['seed']:,.0f} steps/s", flush=True)
        result["chains"] = {k: summary(v) for k, v in chains.items() if v}
        result["chains"]["ratio"] = paired(chains["A"], chains["seed"])

    if a.concurrency:
        conc = {"chunk": 100, "drainers": [1, 2, 4, 8], "reps": a.concurrency_reps,
                "separate": {}, "one_job": {}, "parallel": {}, "C separate": {}}
        runs = [("separate", d) for d in conc["drainers"]] + [("one_job", 1), ("one_job", 8)]
        runs += [("parallel", d) for d in conc["drainers"]] + [("C separate", 1), ("C separate", 2)]
        for rep in range(a.concurrency_reps):
            for mode, d in runs[rep % len(runs):] + runs[:rep % len(runs)]:
                rate = b.concurrency(100, d, mode)
                conc[mode].setdefault(str(d), []).append(rate)
                print(f"concurrency rep={rep + 1}: {d} drainers, {mode}: {rate:,.0f} rows/s", flush=True)
        # the ratios the targets read, repetition by repetition
        conc["ratios"] = {
            "parallel 2 / 1": paired(conc["parallel"]["2"], conc["parallel"]["1"]),
            "parallel 8 / 2": paired(conc["parallel"]["8"], conc["parallel"]["2"]),
            "sequential 1 / parallel 1": paired(conc["one_job"]["1"], conc["parallel"]["1"]),
            "separate jobs 2 / 1": paired(conc["separate"]["2"], conc["separate"]["1"]),
            "C separate 2 / 1": paired(conc["C separate"]["2"], conc["C separate"]["1"]),
        }
        result["concurrency"] = conc

    if a.tables:
        import table_kinds

        result["tables"] = table_kinds.measure(a.db, a.orders, a.reps)
        print("tables:", json.dumps({k: v for k, v in result["tables"].items()}, default=str)[:2000], flush=True)

    if a.kinds:
        import change_kinds

        result["kinds"] = change_kinds.measure(a.db, a.orders, a.reps)
        print("kinds:", json.dumps({k: v for k, v in result["kinds"].items()}, default=str)[:2000], flush=True)

    if a.launches:
        import launches

        result["launches"] = launches.measure(a.db, a.orders, a.launch_reps)
        print("launches:", json.dumps(result["launches"]["first_chunk_ms"]), flush=True)

    sizes = [int(x) for x in a.launch_sizes.split(",") if x.strip() and int(x)]
    if sizes:
        import launches

        result["launch_sizes"] = launches.at_sizes(a.db, sizes, a.launch_size_reps)

    if a.app_seconds:
        import app_latency

        result["app_latency"] = app_latency.measure(a.db, a.app_seconds)
        print("application latency:", json.dumps(result["app_latency"]), flush=True)

    if a.big:
        import big_job

        result["scale"] = big_job.measure(items=a.big, chunk=1000, db=a.db + "_big", removals=a.big)
        print("scale:", json.dumps(result["scale"]), flush=True)
    result["targets"] = targets(result)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(result, indent=2))
    md = markdown(result)
    (out / "latest.md").write_text(md + "\n")
    if set(methods) == set(METHODS):
        plot(result, out / "throughput.png")
    print()
    print(md)
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {a.db} WITH (FORCE)")


if __name__ == "__main__":
    main()
