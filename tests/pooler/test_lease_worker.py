"""examples/lease_worker.py, the worker loop docs/leases-and-locks.md shows, run as three processes
through PgBouncer against one job: the job is done, every key was changed once, and one
worker, the lease holder, committed every chunk."""

import multiprocessing
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))

import lease_worker  # noqa: E402


def _run(dsn, me, out):
    out.put((me, lease_worker.work(dsn, me, "festival", ttl="20 seconds", tick=0.05, max_ticks=400)))


def test_readme_worker_loop_drains_a_job_under_one_lease(pg, bouncer):
    db = pg.admin
    db.execute("DROP TABLE IF EXISTS orders")
    db.execute(
        "CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1, "
        "status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id))"
    )
    db.execute("INSERT INTO orders (tenant, id) SELECT t, g FROM unnest(ARRAY['A', 'B']) t, generate_series(1, 50) g")
    db.execute(
        "SELECT etc_batch.register_job('festival', 'A', 'orders', "
        "(SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', 1)) FROM orders WHERE tenant = 'A'), "
        "5, '{\"status\": \"cancelled\"}')"
    )
    dsn = f"host=127.0.0.1 port={bouncer.port} dbname={pg.name} user=postgres"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(dsn, f"worker-{i}", out)) for i in range(3)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0

    assert db.execute("SELECT status FROM etc_batch.job WHERE job_id = 'festival'").fetchone()[0] == "done"
    # one worker led and committed all ten chunks; the others only asked
    assert sorted(results.values()) == [0, 0, 10], results
    assert db.execute(
        "SELECT count(*), count(DISTINCT item_key) FROM etc_batch.job_audit_items WHERE job_id = 'festival'"
    ).fetchone() == (50, 50)
    assert db.execute(
        "SELECT count(*) FROM orders WHERE tenant = 'A' AND (status, revision) <> ('cancelled', 2)"
    ).fetchone()[0] == 0
    assert db.execute(
        "SELECT count(*) FROM orders WHERE tenant = 'B' AND (status, revision) <> ('pending', 1)"
    ).fetchone()[0] == 0
    # every worker let the lease go at the end: a follower may have taken the released
    # lease once (a new generation each) only to find the job done
    generation, expired = db.execute(
        "SELECT generation, expired FROM etc_batch.leases WHERE name = 'festival-drainer'"
    ).fetchone()
    assert expired and 1 <= generation <= 3, (generation, expired)
