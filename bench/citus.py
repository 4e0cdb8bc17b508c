"""Jobs on a Citus cluster (bench/run citus): a coordinator and two workers on this
machine, servers of their own that bench/run starts and stops, and one table of ROWS
orders (ROWS / 20 customers of 20 orders each, unless --customers says otherwise)
distributed by customer in 8 shards.
Every order gets status 'done' and its revision one higher, four ways:

  shard-aware   etc_batch as it is: the job registered from a query on the distributed
                table, which freezes its items by shard, then drained by one call; a
                chunk of 1,000 lies in one shard (two where a shard's items end inside
                it) and its UPDATE goes to that shard's worker only
  key-ordered   the same job and the same drainer, but registered while the table was
                still a local table, so its items are frozen in key order, and only then
                distributed: a chunk holds whichever customers follow each other in key
                order, and its UPDATE goes to the shards of all of them
  one UPDATE    one multi-shard UPDATE of every row, in one transaction
  hand loop     the loop a competent DBA writes (PL/pgSQL, HAND_LOOP): shard by shard,
                the shard's customers in batches of 1,000 rows, each batch's UPDATE sent
                to its one shard by `customer = ANY(the batch's customers)`, COMMIT per
                batch

Each is timed on the client's wall clock from the start of its work to its end (the
key-ordered job: its registration on the local table plus its drain after
distribution), on a table made afresh, VACUUM ANALYZEd and with every server
checkpointed before, and dropped after; every row must then be 'done' at revision 2.
Each repetition runs the four once each, forward and backward in turn, and a ratio is
the median of the repetitions' own: two variants compared on the same stretch of the
machine's time.

Before the runs, a check on a small table with citus.log_remote_commands: every batch
of the hand loop sends its UPDATE to one shard, and the one UPDATE to all 8.

    python bench/citus.py --rows N --reps R [--customers C] --out DIR

--customers: how many customers the rows are spread over (ROWS / 20 by default: 20
orders each, so that a chunk of 1,000 in key order holds 50 customers, in every shard).
A key-ordered chunk holds 1,000 / (ROWS / C) customers: with 1,000 customers of 1,000
orders each it would be one customer, in one shard, like a shard-aware chunk, and the
report says so under the shards per chunk it measured.
"""

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import ROOT, commit, connect, machine, summary  # noqa: E402

COORDINATOR = ("citus_bench0", 55530)
WORKERS = (("citus_bench1", 55531), ("citus_bench2", 55532))
DB = "bench"
SHARDS = 8
CHUNK = 1000
VARIANTS = ("shard-aware", "key-ordered", "one UPDATE", "hand loop")
TABLES = {"shard-aware": "orders_shard", "key-ordered": "orders_key",
          "one UPDATE": "orders_multi", "hand loop": "orders_loop"}
TARGETS = (("shard-aware / hand loop", "hand loop", 1.0), ("shard-aware / key-ordered", "key-ordered", 1.5))
SETTINGS = ("shared_preload_libraries", "fsync", "shared_buffers", "max_wal_size", "checkpoint_timeout",
            "autovacuum", "max_prepared_transactions", "synchronous_commit", "wal_level",
            "full_page_writes", "work_mem")

TABLE = ("CREATE TABLE {t} (customer int NOT NULL, id int NOT NULL, status text NOT NULL DEFAULT 'new', "
         "revision bigint NOT NULL DEFAULT 1, note text, PRIMARY KEY (customer, id))")

# The DBA's loop: the customers of one shard per batch, COMMIT per batch. Each customer's
# rows and shard are found once, up front (one grouped query over the table, then grouped
# by shard on the coordinator), and the shards taken in the order of their hash ranges.
# Within a shard, customers in order are gathered until their rows make a batch (a
# customer of more rows than a batch is a batch of its own), and each batch is one
# `UPDATE ... WHERE customer = ANY(the batch's customers)`: Citus sends it to the one
# shard, where it reads those customers' rows by the primary key's index. The table is an
# argument, hence EXECUTE with its values bound: Citus plans each statement with them.
HAND_LOOP = """
CREATE OR REPLACE PROCEDURE bench_hand_loop(target regclass, batch int DEFAULT 1000)
LANGUAGE plpgsql AS $proc$
DECLARE
    s record;
    c record;
    custs int[];
    gathered int;
BEGIN
    FOR s IN
        EXECUTE format('SELECT g.shardid, g.custs, g.counts
                          FROM (SELECT get_shard_id_for_distribution_column(%L, r.customer) AS shardid,
                                       array_agg(r.customer ORDER BY r.customer) AS custs,
                                       array_agg(r.n ORDER BY r.customer) AS counts
                                  FROM (SELECT customer, count(*) AS n FROM %s GROUP BY customer) r
                                 GROUP BY 1) g
                          JOIN pg_dist_shard p USING (shardid)
                         ORDER BY p.shardminvalue::int', target, target)
    LOOP
        custs := '{}'; gathered := 0;
        FOR c IN SELECT u.customer, u.n FROM unnest(s.custs, s.counts) AS u(customer, n) LOOP
            custs := custs || c.customer;
            gathered := gathered + c.n;
            IF gathered >= batch THEN
                EXECUTE format('UPDATE %s SET status = ''done'', revision = revision + 1 '
                               'WHERE customer = ANY($1) AND status = ''new''', target) USING custs;
                COMMIT;
                custs := '{}'; gathered := 0;
            END IF;
        END LOOP;
        IF gathered > 0 THEN
            EXECUTE format('UPDATE %s SET status = ''done'', revision = revision + 1 '
                           'WHERE customer = ANY($1) AND status = ''new''', target) USING custs;
            COMMIT;
        END IF;
    END LOOP;
END
$proc$
"""


def node(name, port, db=DB):
    """An autocommit connection to a server of the cluster, on its socket."""
    return connect(db, host=str(ROOT / "target" / "pg" / name), port=port, user="postgres")


def log(message):
    print(message, file=sys.stderr, flush=True)


def setup():
    """Citus in a database `bench` of every server, the workers added to the coordinator,
    etc_batch created (Citus creates it on the workers too) and the hand loop's
    procedure."""
    for name, port in (COORDINATOR, *WORKERS):
        with node(name, port, "postgres") as c:
            c.execute(f"CREATE DATABASE {DB}")
        with node(name, port) as c:
            c.execute("CREATE EXTENSION citus")
    with node(*COORDINATOR) as c:
        c.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (COORDINATOR[1],))
        for _, port in WORKERS:
            c.execute("SELECT citus_add_node('127.0.0.1', %s)", (port,))
        c.execute("CREATE EXTENSION etc_batch")
        c.execute(HAND_LOOP)


def environment(c, rows, customers):
    # as SHOW prints them (pg_settings' setting is in units of `unit`, 8kB for some)
    settings = {name: c.execute("SELECT current_setting(%s)", (name,)).fetchone()[0] for name in SETTINGS}
    return {
        "machine": machine(),
        "postgres": c.execute("SHOW server_version").fetchone()[0],
        "citus": c.execute("SELECT citus_version()").fetchone()[0].split(" on ")[0],
        "etc_batch": c.execute("SELECT extversion FROM pg_extension WHERE extname = 'etc_batch'").fetchone()[0],
        "settings": settings,
        "nodes": {"coordinator": COORDINATOR[1], "workers": [p for _, p in WORKERS]},
        "commit": commit("src", "sql"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": rows,
        "customers": customers,
        "shard_count": SHARDS,
        "chunk": CHUNK,
    }


def make_table(c, t, rows, customers, distribute=True):
    c.execute(f"DROP TABLE IF EXISTS {t}")
    c.execute(TABLE.format(t=t))
    if distribute:
        c.execute("SELECT create_distributed_table(%s, 'customer', shard_count => %s)", (t, SHARDS))
    c.execute(f"INSERT INTO {t} (customer, id) SELECT c, i FROM generate_series(1, %s) c, "
              "generate_series(1, %s) i", (customers, rows // customers))
    c.execute(f"VACUUM ANALYZE {t}")


def distribute_filled(c, t):
    """A local table with rows, distributed; the rows Citus copied out of it into the
    shards removed from the coordinator's own table, as Citus advises."""
    c.execute("SELECT create_distributed_table(%s, 'customer', shard_count => %s)", (t, SHARDS))
    c.execute("SELECT truncate_local_data_after_distributing_table(%s)", (t,))
    c.execute(f"VACUUM ANALYZE {t}")


def checkpoint():
    """Every server's dirty pages written before a timed stretch, so that it does not pay
    for a checkpoint of the load before it."""
    for name, port in (COORDINATOR, *WORKERS):
        with node(name, port) as w:
            w.execute("CHECKPOINT")


def exactly_once(c, t, rows):
    """Every row changed once: 'done' at revision 2, and none left or changed twice."""
    done, total = c.execute(
        f"SELECT count(*) FILTER (WHERE status = 'done' AND revision = 2), count(*) FROM {t}").fetchone()
    assert (done, total) == (rows, rows), (t, done, total, rows)


def register(c, job, t):
    return c.execute(
        "SELECT items, chunks FROM etc_batch.register_job_from_query(%s, NULL, %s, %s, %s, "
        "'{\"status\": \"done\"}', tenant_column => NULL)",
        (job, t, f"SELECT customer, id, revision FROM {t}", CHUNK)).fetchone()


def shards_per_chunk(c, job, t):
    """How many shards each chunk of the job's frozen list lies in, as Citus places the
    customers of its keys: median, min and max over the chunks."""
    counts = [r[0] for r in c.execute(
        "SELECT count(DISTINCT get_shard_id_for_distribution_column(%s, (i.item_key::jsonb ->> 0)::int)) "
        "FROM etc_batch.job_item i JOIN etc_batch.job j USING (job_id) WHERE i.job_id = %s "
        "GROUP BY i.position / j.chunk_size", (t, job))]
    return {"median": statistics.median(counts), "min": min(counts), "max": max(counts), "chunks": len(counts)}


def drained(c, job, rows):
    status, items = c.execute(
        "SELECT j.status, (SELECT count(*) FROM etc_batch.job_item i WHERE i.job_id = j.job_id) "
        "FROM etc_batch.job j WHERE j.job_id = %s", (job,)).fetchone()
    assert (status, items) == ("done", rows), (job, status, items)


def run(c, variant, rows, customers, rep):
    """One variant on a table of its own: its seconds and what else it measured."""
    t = TABLES[variant]
    job = f"citus-{variant.replace(' ', '-')}-{rep}"
    out = {}
    if variant == "key-ordered":
        # frozen while the table is local: in key order, as on any table
        make_table(c, t, rows, customers, distribute=False)
        checkpoint()
        start = time.perf_counter()
        assert register(c, job, t)[0] == rows
        out["register_s"] = time.perf_counter() - start
        distribute_filled(c, t)
        checkpoint()
        start = time.perf_counter()
        c.execute("CALL etc_batch.drain_job(%s)", (job,))
        out["drain_s"] = time.perf_counter() - start
        out["seconds"] = out["register_s"] + out["drain_s"]
    else:
        make_table(c, t, rows, customers)
        checkpoint()
        start = time.perf_counter()
        if variant == "shard-aware":
            assert register(c, job, t)[0] == rows
            out["register_s"] = time.perf_counter() - start
            c.execute("CALL etc_batch.drain_job(%s)", (job,))
        elif variant == "one UPDATE":
            # one statement in autocommit: one transaction
            c.execute(f"UPDATE {t} SET status = 'done', revision = revision + 1 WHERE status = 'new'")
        else:
            c.execute("CALL bench_hand_loop(%s, %s)", (t, CHUNK))
        out["seconds"] = time.perf_counter() - start
        if variant == "shard-aware":
            out["drain_s"] = out["seconds"] - out["register_s"]
    exactly_once(c, t, rows)
    if variant in ("shard-aware", "key-ordered"):
        drained(c, job, rows)
        out["shards_per_chunk"] = shards_per_chunk(c, job, t)
    c.execute(f"DROP TABLE {t}")
    out["rows_per_s"] = rows / out["seconds"]
    return out


def batches(lines, table):
    """From the commands Citus logged sending to the workers: the shards of each
    UPDATE of `table` between two commits, and how the transaction committed there (one
    phase, COMMIT; two, PREPARE TRANSACTION and COMMIT PREPARED)."""
    out, shards = [], set()
    for line in lines:
        if m := re.match(rf"issuing UPDATE public\.{table}_(\d+) ", line):
            shards.add(int(m.group(1)))
        elif shards and (line == "issuing COMMIT" or line.startswith("issuing PREPARE TRANSACTION")):
            out.append({"shards": sorted(shards), "two_phase": line != "issuing COMMIT"})
            shards = set()
    assert not shards, "an UPDATE logged with no commit after it"
    return out


def check_routing(c, customers=1000, per_customer=10):
    """On a small table, with citus.log_remote_commands: the shards each batch of the
    hand loop's UPDATE goes to, and those the one UPDATE goes to."""
    t = "orders_check"
    lines = []

    def heard(d):
        lines.append(d.message_primary or "")

    c.add_notice_handler(heard)
    out = {"rows": customers * per_customer, "batch": CHUNK}
    for name, statement in (("hand loop", f"CALL bench_hand_loop('{t}', {CHUNK})"),
                            ("one UPDATE", f"UPDATE {t} SET status = 'done', revision = revision + 1 "
                                           "WHERE status = 'new'")):
        make_table(c, t, customers * per_customer, customers)
        shard_rows = [r[0] for r in c.execute(
            f"SELECT count(*) FROM {t} GROUP BY get_shard_id_for_distribution_column(%s, customer)", (t,))]
        c.execute("SET citus.log_remote_commands = on")
        c.execute("SET client_min_messages = log")
        lines.clear()
        try:
            c.execute(statement)
        finally:
            c.execute("RESET citus.log_remote_commands")
            c.execute("RESET client_min_messages")
        exactly_once(c, t, customers * per_customer)
        c.execute(f"DROP TABLE {t}")
        found = batches(lines, t)
        out[name] = {"batches": len(found),
                     "shards_per_batch": sorted({len(b["shards"]) for b in found}),
                     "shards": len({s for b in found for s in b["shards"]}),
                     "two_phase_commits": sum(b["two_phase"] for b in found)}
        if name == "hand loop":
            # a batch per 1,000 rows of each shard, each UPDATE to its one shard, all 8 visited
            out[name]["batches_expected"] = sum(math.ceil(n / CHUNK) for n in shard_rows)
            assert out[name]["batches"] == out[name]["batches_expected"], out[name]
            assert out[name]["shards_per_batch"] == [1] and out[name]["shards"] == SHARDS, out[name]
        else:
            assert out[name]["batches"] == 1 and out[name]["shards_per_batch"] == [SHARDS], out[name]
    c.remove_notice_handler(heard)
    return out


def spread(s, fmt):
    return f"{fmt(s['median'])} ({fmt(s['min'])} to {fmt(s['max'])})"


def markdown(r):
    env = r["environment"]
    rows, customers = env["rows"], env["customers"]
    settings = ", ".join(f"{k}={v}" for k, v in sorted(env["settings"].items()))
    out = [
        f"Measured {env['date']} on {env['machine']}; PostgreSQL {env['postgres']}; {env['citus']}; "
        f"etc_batch {env['etc_batch']}, this tree at commit {env['commit']}.",
        f"Cluster: a coordinator (port {env['nodes']['coordinator']}) and two workers (ports "
        f"{', '.join(map(str, env['nodes']['workers']))}) on this machine, over loopback, each with: {settings}.",
        "",
        f"One table of {rows:,} orders, {customers:,} customers of {rows // customers:,} ids each, "
        f"distributed by customer in {env['shard_count']} shards, made afresh for each variant and "
        "repetition, VACUUM ANALYZEd, every server checkpointed, then every order set 'done' with its "
        "revision one higher, each way timed on the client's wall clock from the start of its work to its "
        f"end; every row checked 'done' at revision 2 after each. {r['reps']} repetition(s), each running "
        "the four once, forward and backward in turn. Rows per second, median (min to max):",
        "",
        "| variant | rows/s | seconds | of which registration, s |",
        "|---|---|---|---|",
    ]
    for v in VARIANTS:
        s = r["summary"][v]
        reg = spread(s["register_s"], lambda x: f"{x:.2f}") if "register_s" in s else ""
        out.append(f"| {v} | {spread(s['rows_per_s'], lambda x: f'{x:,.0f}')} | "
                   f"{spread(s['seconds'], lambda x: f'{x:.2f}')} | {reg} |")
    out += [
        "",
        f"- shard-aware: `register_job_from_query` on the distributed table (chunk {env['chunk']:,}), "
        "then `CALL etc_batch.drain_job`; registration freezes the items by shard, so a chunk's UPDATE "
        "goes to one shard (two where a shard's items end inside the chunk).",
        "- key-ordered: the same job and the same drainer; only the order of the frozen list differs. "
        "It was registered while the table was still local, so its items were frozen in key order "
        "(customer, id), and the table was distributed after: a chunk holds whichever customers follow "
        "each other in key order, and its UPDATE goes to the shards of all of them. Its time is the "
        "registration on the local table plus the drain after distribution.",
        "- one UPDATE: `UPDATE ... WHERE status = 'new'` of every row in one multi-shard transaction.",
        "- hand loop: PL/pgSQL, shard by shard (in the order of their hash ranges, each shard's "
        "customers and their rows counted once up front), the shard's customers in order gathered "
        "into batches of 1,000 rows, each `UPDATE ... WHERE customer = ANY(the batch's customers) "
        "AND status = 'new'` sent to the one shard, COMMIT per batch.",
        "",
        "Shards per chunk of the two jobs' frozen lists, median (min to max) over the chunks:",
        "",
    ]
    for v in ("shard-aware", "key-ordered"):
        s = r["runs"][0][v]["shards_per_chunk"]
        out.append(f"- {v}: {s['median']:g} ({s['min']} to {s['max']}) over {s['chunks']:,} chunks")
    per_chunk = CHUNK / (rows // customers)
    if r["runs"][0]["key-ordered"]["shards_per_chunk"]["median"] < env["shard_count"]:
        out += ["", f"Note: with {rows // customers:,} ids per customer a key-ordered chunk of "
                f"{env['chunk']:,} holds the ids of about {max(per_chunk, 1):g} customer(s), so it does not span "
                f"all {env['shard_count']} shards: the key-ordered variant is then not the all-shards "
                "case it stands for here."]
    out += ["", "Ratios of rows per second, each the median of the repetitions' own (min to max):", "",
            "| ratio | measured | target | |", "|---|---|---|---|"]
    for name, _, bound in TARGETS:
        s = r["ratios"][name]
        met = "met" if s["median"] >= bound else "missed"
        every = "" if s["min"] >= bound or s["median"] < bound else ", not in every repetition"
        out.append(f"| {name} | {spread(s, lambda x: f'{x:.2f}')} | ≥ {bound} | {met}{every} |")
    # the drains alone: the same drainer over the two orders of one frozen list, its
    # registration (on the distributed table, or on the table before it was distributed)
    # left out
    drains = summary([x["key-ordered"]["drain_s"] / x["shard-aware"]["drain_s"] for x in r["runs"]])
    per = {v: summary([rows / x[v]["drain_s"] for x in r["runs"]]) for v in ("shard-aware", "key-ordered")}
    out += ["", "The drains alone, registration left out: shard-aware "
            f"{spread(per['shard-aware'], lambda x: f'{x:,.0f}')} rows/s, key-ordered "
            f"{spread(per['key-ordered'], lambda x: f'{x:,.0f}')}; shard-aware / key-ordered "
            f"{spread(drains, lambda x: f'{x:.2f}')}."]
    ch = r["check"]
    loop, one = ch["hand loop"], ch["one UPDATE"]
    out += ["", f"Routing, checked with citus.log_remote_commands on a table of {ch['rows']:,} rows "
            "before the runs: the hand loop's "
            f"{loop['batches']} batches of up to {ch['batch']:,} ({loop['batches_expected']} expected) each sent "
            f"their UPDATE to {' or '.join(map(str, loop['shards_per_batch']))} shard, {loop['shards']} shards "
            f"in all, {loop['two_phase_commits']} of them committed in two phases; the one UPDATE went to "
            f"{one['shards_per_batch'][0]} shards in one statement, committed in "
            f"{'two phases' if one['two_phase_commits'] else 'one phase'}."]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--customers", type=int, default=None, help="ROWS / 20 when not given")
    ap.add_argument("--out", default=None, help="directory for latest.md and latest.json")
    ap.add_argument("--report", default=None, help="a latest.json to print the report of, running nothing")
    a = ap.parse_args()
    if a.report:
        sys.stdout.write(markdown(json.loads(Path(a.report).read_text())))
        return
    a.customers = a.customers or max(a.rows // 20, 1)
    assert a.rows % a.customers == 0 and a.rows >= a.customers, "ROWS must be a multiple of the customers"
    setup()
    with node(*COORDINATOR) as c:
        env = environment(c, a.rows, a.customers)
        log("checking where the hand loop's and the one UPDATE's statements go")
        check = check_routing(c)
        runs = []
        for rep in range(a.reps):
            # forward, then backward: no variant always runs first, or always after another
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            runs.append({})
            for v in order:
                runs[rep][v] = run(c, v, a.rows, a.customers, rep)
                log(f"repetition {rep + 1}: {v}: {runs[rep][v]['rows_per_s']:,.0f} rows/s "
                    f"({runs[rep][v]['seconds']:.2f} s)")
    result = {"environment": env, "reps": a.reps, "check": check, "runs": runs, "summary": {}, "ratios": {}}
    for v in VARIANTS:
        result["summary"][v] = {k: summary([r[v][k] for r in runs])
                                for k in ("rows_per_s", "seconds", "register_s", "drain_s") if k in runs[0][v]}
    for name, other, bound in TARGETS:
        result["ratios"][name] = summary([r["shard-aware"]["rows_per_s"] / r[other]["rows_per_s"] for r in runs])
        result["ratios"][name]["target"] = bound
        result["ratios"][name]["met"] = result["ratios"][name]["median"] >= bound
    md = markdown(result)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "latest.json").write_text(json.dumps(result, indent=2))
        (out / "latest.md").write_text(md)
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
