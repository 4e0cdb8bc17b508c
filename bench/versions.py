"""One big job on the version of etc_batch installed now, for a comparison of releases on
one machine (bench/run versions): a job of ITEMS orders registered from a query and
drained by one call, chunk 1,000, its registration time and its drain's rows per second,
and a check that every approved order changed once and the other tenant not at all.
Only what every release since 0.3.0 has is used: register_job_from_query and drain_job
with their first arguments.

    python bench/versions.py --items N --out FILE       one run, on the installed version
    python bench/versions.py --report FILE... [--json OUT]   the runs, as a markdown report

The runs of bench/run versions alternate the versions, so that each pair of runs shares
one stretch of the machine's time; the report gives each version's medians and, for
every later version, the median of its runs' ratios to the first version's run of the
same pair.
"""

import argparse
import json
import statistics
import sys
import time

import psycopg


def measure(items, chunk, db):
    with psycopg.connect("dbname=postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {db}")
    try:
        with psycopg.connect(f"dbname={db}", autocommit=True, prepare_threshold=None) as c:
            c.add_notice_handler(lambda d: None)
            c.execute("CREATE EXTENSION etc_batch")
            version = c.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'etc_batch'").fetchone()[0]
            c.execute(
                "CREATE TABLE orders (tenant text, id bigint, revision int NOT NULL DEFAULT 1, "
                "qty int, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))")
            c.execute("INSERT INTO orders (tenant, id, qty) "
                      "SELECT t, g, g %% 5 FROM generate_series(1, %s) g, "
                      "(VALUES ('A'), ('B')) v(t) WHERE t = 'A' OR g <= %s",
                      (items, items // 10))
            c.execute("VACUUM ANALYZE orders")
            c.execute("CHECKPOINT")
            t = time.perf_counter()
            c.execute(
                "SELECT * FROM etc_batch.register_job_from_query('big', 'A', 'orders', "
                "$$SELECT id, revision, qty FROM orders WHERE tenant = 'A' AND status = 'pending'$$, "
                "%s, '{\"status\": \"cancelled\"}', '{\"status\": \"pending\"}')", (chunk,)).fetchone()
            register = time.perf_counter() - t
            # the drain starts from a clean checkpoint, as in big_job.py
            c.execute("CHECKPOINT")
            t = time.perf_counter()
            c.execute("CALL etc_batch.drain_job('big')")
            drain = time.perf_counter() - t
            changed, others = c.execute(
                "SELECT count(*) FILTER (WHERE tenant = 'A' AND status = 'cancelled' AND revision = 2), "
                "count(*) FILTER (WHERE tenant = 'B' AND (status <> 'pending' OR revision <> 1)) "
                "FROM orders").fetchone()
            assert (changed, others) == (items, 0), (changed, others)
    finally:
        with psycopg.connect("dbname=postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    return {"version": version, "items": items, "chunk_size": chunk,
            "register_s": round(register, 2), "drain_s": round(drain, 2),
            "drain_rows_per_s": round(items / drain)}


def report(runs, environment):
    """The runs (each with its pair's number) as markdown."""
    versions = []
    for r in runs:
        if r["version"] not in versions:
            versions.append(r["version"])
    first = versions[0]
    by_pair = {}
    for r in runs:
        by_pair.setdefault(r["pair"], {})[r["version"]] = r
    items = runs[0]["items"]
    out = [environment, "",
           f"One job of {items:,} orders of one tenant among {items // 10:,} of another, registered "
           f"from a query and drained by one call, chunk {runs[0]['chunk_size']:,}, on each "
           f"version in turn; {len(by_pair)} rounds, each running every version once, in an "
           "order that turns from one round to the next. Median (min to max).", "",
           "| version | registration, s | drain, rows/s |", "|---|---|---|"]

    def spread(values, fmt):
        return (f"{fmt(statistics.median(values))} ({fmt(min(values))} to {fmt(max(values))})")

    for v in versions:
        mine = [r for r in runs if r["version"] == v]
        out.append(f"| {v} | {spread([r['register_s'] for r in mine], lambda x: f'{x:.2f}')} | "
                   f"{spread([r['drain_rows_per_s'] for r in mine], lambda x: f'{x:,.0f}')} |")
    out += ["", f"Each version over {first} in the same round, the median of the rounds' own "
            "ratios (min to max): registration time (lower is faster) and drain rows per second.",
            "", f"| version | registration time / {first}'s | drain rows/s / {first}'s |",
            "|---|---|---|"]
    for v in versions[1:]:
        pairs = [p for p in by_pair.values() if v in p and first in p]
        reg = [p[v]["register_s"] / p[first]["register_s"] for p in pairs]
        drain = [p[v]["drain_rows_per_s"] / p[first]["drain_rows_per_s"] for p in pairs]
        out.append(f"| {v} | {spread(reg, lambda x: f'{x:.2f}')} | {spread(drain, lambda x: f'{x:.2f}')} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=2_000_000)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--db", default="bench_versions")
    ap.add_argument("--pair", type=int, default=0, help="the round this run belongs to")
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", nargs="*", default=None, help="run files to report on")
    ap.add_argument("--json", default=None, help="with --report: the runs, together, to this file")
    a = ap.parse_args()
    if a.report is not None:
        from bench import environment
        env = environment("postgres")
        header = (f"Measured {env['date']} on {env['machine']}; PostgreSQL {env['postgres']}; "
                  f"this tree at commit {env['commit']}.\nSettings: "
                  + ", ".join(f"{k}={v}" for k, v in sorted(env["settings"].items())) + ".")
        runs = [json.load(open(f)) for f in a.report]
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"environment": env, "runs": runs}, f, indent=2)
        sys.stdout.write(report(runs, header))
        return
    r = measure(a.items, a.chunk, a.db)
    r["pair"] = a.pair
    print(json.dumps(r))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f)


if __name__ == "__main__":
    main()
