"""etc_batch behind a real PgBouncer in transaction pooling mode.

Eight client processes share three server connections (default_pool_size = 3), the
way application workers share a pooler. What a session remembers (a session-level
advisory lock, a startup parameter) does not follow a client from one transaction to
the next; what a row remembers (a lease, a job's checkpoint) does.
"""

import datetime
import json
import os
import signal
import time

import pytest
from psycopg import errors, sql
from psycopg.rows import dict_row

from conftest import POOL_SIZE, WAIT, connect_bouncer, wait_until

WORKERS = 8
TICKS = 20
ADVISORY_KEY = 4242


# worker processes (run in spawned children: they open their own connections) -------------


def lockstep_worker(i, port, dbname, kind, ticks, barrier, out):
    """Runs `ticks` ticks in lockstep with the other workers (one barrier per tick) and
    reports (tick, worker, leader?, holder, generation, backend pid) for each."""
    conn = None
    try:
        conn = connect_bouncer(port, dbname)
        for tick in range(ticks):
            barrier.wait(WAIT)
            if kind == "advisory":
                got, pid = conn.execute(
                    "SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (ADVISORY_KEY,)
                ).fetchone()
                out.send(("tick", tick, i, got, None, None, pid))
            else:
                got, holder, generation, pid = conn.execute(
                    "SELECT a.acquired, a.holder, a.generation, pg_backend_pid() "
                    "FROM etc_batch.acquire_lease('leader', %s, '30 seconds') a",
                    (f"worker-{i}",),
                ).fetchone()
                out.send(("tick", tick, i, got, holder, generation, pid))
    except BaseException as exc:  # reported to the test, which fails on it
        out.send(("error", i, repr(exc)))
        barrier.abort()
    finally:
        if conn is not None:
            conn.close()


def lease_worker(i, port, dbname, lease, ttl, tick, run_for, stop, out):
    """Tries to take or renew `lease` every `tick` seconds until stop.value is set (or
    run_for seconds passed), reporting every answer with the server's clock. stop is a
    lock-free shared value: a sibling killed by the test cannot leave it locked."""
    holder = f"worker-{i}"
    conn = None
    try:
        conn = connect_bouncer(port, dbname, row_factory=dict_row)
        deadline = time.monotonic() + run_for
        next_tick = time.monotonic()
        last_generation = None
        while not stop.value and time.monotonic() < deadline:
            row = conn.execute(
                "SELECT a.acquired, a.holder, a.generation, a.expires_at, "
                "       clock_timestamp() AS answered_at "
                "FROM etc_batch.acquire_lease(%s, %s, %s::interval) a",
                (lease, holder, ttl),
            ).fetchone()
            acquired_at = None
            if row["acquired"] and row["generation"] != last_generation:
                view = conn.execute(
                    "SELECT generation, acquired FROM etc_batch.leases WHERE name = %s", (lease,)
                ).fetchone()
                if view is not None and view["generation"] == row["generation"]:
                    acquired_at = view["acquired"]
                last_generation = row["generation"]
            out.send(("report", i, {**row, "acquired_at": acquired_at, "worker": i}))
            next_tick += tick
            time.sleep(max(0.0, next_tick - time.monotonic()))
    except BaseException as exc:
        out.send(("error", i, repr(exc)))
    finally:
        if conn is not None:
            conn.close()


def collect_ticks(workers, expected):
    """Reads `expected` tick reports; fails on a worker's error."""
    rows = []
    deadline = time.monotonic() + WAIT + 10
    while len(rows) < expected:
        got = workers.recv(max(0.0, deadline - time.monotonic()))
        if got is None:
            raise AssertionError(f"only {len(rows)} of {expected} tick reports arrived")
        item = got[1]
        if item[0] == "error":
            raise AssertionError(f"worker {item[1]} failed: {item[2]}")
        rows.append(item[1:])
    return rows


def run_lockstep(bouncer, workers, dbname, kind, ticks=TICKS):
    barrier = workers.ctx.Barrier(WORKERS)
    workers.start(
        lockstep_worker,
        [(i, bouncer.port, dbname, kind, ticks, barrier) for i in range(WORKERS)],
    )
    rows = collect_ticks(workers, WORKERS * ticks)
    workers.join_all(WAIT)
    assert all(p.exitcode == 0 for p in workers.procs), [p.exitcode for p in workers.procs]
    by_tick = {}
    for tick, i, got, holder, generation, pid in rows:
        by_tick.setdefault(tick, []).append(
            {"worker": i, "got": got, "holder": holder, "generation": generation, "pid": pid}
        )
    assert sorted(by_tick) == list(range(ticks))
    assert all(len(v) == WORKERS for v in by_tick.values())
    return by_tick


# 1 ----------------------------------------------------------------------------------------


def test_session_advisory_locks_elect_several_leaders_behind_pgbouncer(pg, bouncer, workers):
    by_tick = run_lockstep(bouncer, workers, pg.name, "advisory")

    leaders_per_tick = {t: sorted(r["worker"] for r in rows if r["got"]) for t, rows in by_tick.items()}
    backends = sorted({r["pid"] for rows in by_tick.values() for r in rows})
    print("\nsession advisory lock behind pgbouncer: leaders per tick (worker numbers)")
    for t in sorted(by_tick):
        pids = {r["worker"]: r["pid"] for r in by_tick[t]}
        print(f"  tick {t:2d}: {len(leaders_per_tick[t])} leader(s) {leaders_per_tick[t]}  "
              f"backend per worker {pids}")
    print(f"  server backends used: {backends}")

    # The eight clients ran on at most three server sessions ...
    assert 1 <= len(backends) <= POOL_SIZE, backends
    # ... and every client that landed on the session holding the lock "got" it again:
    # pg_try_advisory_lock is reentrant within a session.
    multi = {t: w for t, w in leaders_per_tick.items() if len(w) > 1}
    leaderless = [t for t, w in leaders_per_tick.items() if not w]
    print(f"  ticks with several leaders: {len(multi)} of {len(by_tick)}; "
          f"with none (the lock's session served nobody): {len(leaderless)}")
    assert multi, f"no tick had more than one leader: {leaders_per_tick}"
    # Leadership did not even stay with one worker.
    assert len({w for ws in leaders_per_tick.values() for w in ws}) > 1, leaders_per_tick

    # The lock outlived every client transaction: it sits in an idle pooled session,
    # which is what doctor() reports.
    holders = [
        r[0]
        for r in pg.admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND objid = %s AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (ADVISORY_KEY,),
        ).fetchall()
    ]
    assert len(holders) == 1 and holders[0] in backends, (holders, backends)
    leaked = pg.admin.execute(
        "SELECT status, detail FROM etc_batch.doctor() WHERE check_name = 'session advisory locks'"
    ).fetchall()
    assert any(s == "warn" and f"Backend {holders[0]} " in d for s, d in leaked), leaked

    # Clean up: fresh server connections drop the leaked lock.
    bouncer.admin("RECONNECT")
    wait_until(
        lambda: pg.admin.execute(
            "SELECT NOT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objid = %s)",
            (ADVISORY_KEY,),
        ).fetchone()[0],
        "the leaked advisory lock to go with its server connection",
    )


# 2 ----------------------------------------------------------------------------------------


def test_lease_elects_exactly_one_leader_per_tick(pg, bouncer, workers):
    by_tick = run_lockstep(bouncer, workers, pg.name, "lease")

    leaders = {t: [r for r in rows if r["got"]] for t, rows in by_tick.items()}
    print("\nlease behind pgbouncer: leader per tick")
    for t in sorted(leaders):
        print(f"  tick {t:2d}: {[(r['worker'], r['holder'], r['generation']) for r in leaders[t]]}")

    assert all(len(v) == 1 for v in leaders.values()), leaders
    holders = {v[0]["holder"] for v in leaders.values()}
    assert len(holders) == 1, holders
    holder = holders.pop()
    assert all(v[0]["holder"] == f"worker-{v[0]['worker']}" for v in leaders.values())
    # Everybody else was told who holds it, at which generation.
    for t, rows in by_tick.items():
        for r in rows:
            assert r["holder"] == holder, (t, r)
            assert r["generation"] == 1, (t, r)
    row = pg.admin.execute(
        "SELECT holder, generation, expired FROM etc_batch.leases WHERE name = 'leader'"
    ).fetchone()
    assert row == (holder, 1, False)


# 3 ----------------------------------------------------------------------------------------


class LeaseReports:
    """The lease workers' reports, in arrival order."""

    def __init__(self, workers):
        self.workers = workers
        self.all = []

    def next_matching(self, predicate, what, timeout):
        deadline = time.monotonic() + timeout
        while True:
            got = self.workers.recv(max(0.0, min(0.25, deadline - time.monotonic())))
            if got is not None:
                item = got[1]
                if item[0] == "error":
                    raise AssertionError(f"worker {item[1]} failed: {item[2]}")
                report = item[2]
                self.all.append(report)
                if predicate(report):
                    return report
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")

    def drain(self):
        while (got := self.workers.recv(0.5)) is not None:
            if got[1][0] == "report":
                self.all.append(got[1][2])


def test_killed_leader_is_replaced_within_ttl_plus_a_tick(pg, bouncer, workers):
    lease, ttl, tick = "failover", datetime.timedelta(seconds=2), 0.25
    slack = datetime.timedelta(seconds=1)
    stop = workers.ctx.RawValue("b", 0)
    procs = workers.start(
        lease_worker,
        [(i, bouncer.port, pg.name, lease, "2 seconds", tick, 15.0, stop)
         for i in range(WORKERS)],
    )
    reports = LeaseReports(workers)

    first = reports.next_matching(lambda r: r["acquired"], "a first leader", WAIT)
    generation = first["generation"]
    leader = first["worker"]
    takeovers = []

    for _ in range(2):
        # the leader renews, at the same generation
        for _renewal in range(2):
            reports.next_matching(
                lambda r: r["worker"] == leader and r["acquired"],
                f"worker-{leader} to renew",
                WAIT,
            )
        assert all(
            r["generation"] == generation for r in reports.all if r["holder"] == f"worker-{leader}"
        )
        os.kill(procs[leader].pid, signal.SIGKILL)
        procs[leader].join(WAIT)
        assert procs[leader].exitcode == -signal.SIGKILL
        # A statement it sent just before dying may still commit; after that the row
        # holds its final expiry.
        time.sleep(0.5)
        old = pg.admin.execute(
            "SELECT holder, generation, expires_at FROM etc_batch.lease WHERE name = %s", (lease,)
        ).fetchone()
        assert old[:2] == (f"worker-{leader}", generation), old
        old_expiry = old[2]
        reported = max(
            r["expires_at"] for r in reports.all if r["worker"] == leader and r["acquired"]
        )
        assert reported <= old_expiry

        new = reports.next_matching(
            lambda r: r["acquired"] and r["generation"] != generation,
            f"a new leader after worker-{leader} was killed",
            ttl.total_seconds() + WAIT,
        )
        takeover_at = new["acquired_at"] or new["answered_at"]
        takeovers.append(
            {"killed": leader, "new": new["worker"], "old_generation": generation,
             "new_generation": new["generation"], "old_expiry": old_expiry,
             "takeover_at": takeover_at}
        )
        print(f"\nworker-{leader} killed, lease expired {old_expiry}; worker-{new['worker']} took "
              f"over at {takeover_at} (+{(takeover_at - old_expiry).total_seconds():.3f}s), "
              f"generation {generation} -> {new['generation']}")
        assert new["worker"] != leader
        assert new["generation"] == generation + 1, (generation, new)
        assert old_expiry <= takeover_at <= old_expiry + datetime.timedelta(seconds=tick) + slack, (
            old_expiry, takeover_at)
        leader, generation = new["worker"], new["generation"]

    stop.value = 1
    workers.join_all(WAIT)
    reports.drain()
    assert all(p.exitcode == 0 for i, p in enumerate(procs) if i not in {t["killed"] for t in takeovers})

    # Every generation had exactly one holder, and the generations went up one by one.
    holder_of = {}
    for r in reports.all:
        if r["acquired"]:
            holder_of.setdefault(r["generation"], set()).add(r["holder"])
    assert all(len(h) == 1 for h in holder_of.values()), holder_of
    assert sorted(holder_of) == [first["generation"] + k for k in range(3)], holder_of
    final = pg.admin.execute(
        "SELECT holder, generation FROM etc_batch.lease WHERE name = %s", (lease,)
    ).fetchone()
    assert final == (f"worker-{leader}", generation)


# 4 ----------------------------------------------------------------------------------------


def test_stale_leader_commits_nothing(pg, bouncer):
    admin = pg.direct(row_factory=dict_row)
    admin.execute(
        "CREATE TABLE orders (tenant text, id int, revision int, status text, PRIMARY KEY (tenant, id))"
    )
    admin.execute(
        "INSERT INTO orders SELECT 'A', g, 1, 'pending' FROM generate_series(1, 10) g"
    )
    admin.execute("CREATE TABLE chain_effect (step int NOT NULL)")
    before = admin.execute("SELECT * FROM orders ORDER BY tenant, id").fetchall()
    items = [{"id": k, "revision": 1} for k in range(1, 8)]
    admin.execute(
        "SELECT * FROM etc_batch.register_job('job', 'A', 'orders', %s::jsonb, 3, "
        "'{\"status\": \"cancelled\"}'::jsonb, '{\"status\": \"pending\"}'::jsonb)",
        (json.dumps(items),),
    )

    a = bouncer.connect(pg.name)
    b = bouncer.connect(pg.name)
    first = None
    for k in (1, 2, 3):
        step = a.execute(
            "SELECT etc_batch.add_step('fenced', %s)", (f"INSERT INTO chain_effect VALUES ({k})",)
        ).fetchone()[0]
        first = first or step

    acquired, holder, g, _ = a.execute(
        "SELECT * FROM etc_batch.acquire_lease('drainer', 'A', '1 second')"
    ).fetchone()
    assert (acquired, holder) == (True, "A")
    wait_until(
        lambda: a.execute("SELECT expired FROM etc_batch.leases WHERE name = 'drainer'").fetchone()[0],
        "A's lease to expire",
    )
    acquired, holder, g_b, _ = b.execute(
        "SELECT * FROM etc_batch.acquire_lease('drainer', 'B', '60 seconds')"
    ).fetchone()
    assert (acquired, holder, g_b) == (True, "B", g + 1)

    # A, stale, drains: refused before the first chunk changes anything.
    with pytest.raises(errors.InvalidTransactionInitiation) as refused:
        a.execute(
            "CALL etc_batch.drain_job('job', lease_name => 'drainer', lease_holder => 'A', "
            "lease_generation => %s)",
            (g,),
        )
    assert refused.value.sqlstate == "0B000"
    assert '"B"' in (refused.value.diag.message_detail or ""), refused.value.diag.message_detail
    job = admin.execute(
        "SELECT status, next_index, chunks_committed FROM etc_batch.job WHERE job_id = 'job'"
    ).fetchone()
    assert job == {"status": "pending", "next_index": 0, "chunks_committed": 0}
    assert admin.execute("SELECT count(*) AS n FROM etc_batch.job_audit").fetchone()["n"] == 0
    assert admin.execute("SELECT * FROM orders ORDER BY tenant, id").fetchall() == before

    # A, stale, runs the chain: refused before the first step runs.
    with pytest.raises(errors.InvalidTransactionInitiation) as refused:
        a.execute(
            "CALL etc_batch.exec_batch_from_id(%s, lease_name => 'drainer', lease_holder => 'A', "
            "lease_generation => %s)",
            (first, g),
        )
    assert refused.value.sqlstate == "0B000"
    assert admin.execute("SELECT count(*) AS n FROM chain_effect").fetchone()["n"] == 0
    steps = admin.execute(
        "SELECT status, attempts FROM etc_batch.batch_log WHERE batch = 'fenced' ORDER BY id"
    ).fetchall()
    assert steps == [{"status": "pending", "attempts": 0}] * 3

    with pytest.raises(errors.InvalidTransactionInitiation):
        a.execute("SELECT etc_batch.check_lease('drainer', 'A', %s)", (g,))
    # A cannot sneak back in under its old generation either.
    acquired, holder, generation, _ = a.execute(
        "SELECT * FROM etc_batch.acquire_lease('drainer', 'A', '1 second')"
    ).fetchone()
    assert (acquired, holder, generation) == (False, "B", g + 1)

    # B, the holder, does the work.
    result = b.execute(
        "CALL etc_batch.drain_job('job', lease_name => 'drainer', lease_holder => 'B', "
        "lease_generation => %s)",
        (g_b,),
    ).fetchone()
    assert tuple(result) == (3, 7, "1", "7", "done"), result
    job = admin.execute(
        "SELECT status, next_index FROM etc_batch.job WHERE job_id = 'job'"
    ).fetchone()
    assert job == {"status": "done", "next_index": 7}
    changed = admin.execute(
        "SELECT id, status FROM orders WHERE tenant = 'A' ORDER BY id"
    ).fetchall()
    assert [r["status"] for r in changed] == ["cancelled"] * 7 + ["pending"] * 3

    b.execute(
        "CALL etc_batch.exec_batch_from_id(%s, lease_name => 'drainer', lease_holder => 'B', "
        "lease_generation => %s)",
        (first, g_b),
    )
    assert [r["step"] for r in admin.execute("SELECT step FROM chain_effect ORDER BY step")] == [1, 2, 3]
    assert [r["status"] for r in admin.execute(
        "SELECT status FROM etc_batch.batch_log WHERE batch = 'fenced'"
    )] == ["done"] * 3
    b.execute("SELECT etc_batch.check_lease('drainer', 'B', %s)", (g_b,))
    assert b.execute("SELECT etc_batch.release_lease('drainer', 'B')").fetchone()[0] is True


# 5 ----------------------------------------------------------------------------------------


def doctor_rows(conn):
    return {
        r[0]: {"status": r[1], "detail": r[2], "hint": r[3]}
        for r in conn.execute("SELECT check_name, status, detail, hint FROM etc_batch.doctor()")
    }


def prepare_app_role(pg, role):
    """Lets role run the doctor and add steps, and makes it own a step; no role
    setting for statement_timeout."""
    ident = sql.Identifier(role)
    pg.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(ident))
    pg.admin.execute(
        sql.SQL(
            "GRANT EXECUTE ON FUNCTION etc_batch.doctor(), etc_batch.add_step(text, text, bigint, boolean, interval, integer) TO {}"
        ).format(ident)
    )
    # the doctor reads etc_batch's tables with the caller's privileges (docs/security.md, Privileges)
    pg.admin.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA etc_batch TO {}").format(ident))
    pg.admin.execute(sql.SQL("ALTER ROLE {} RESET statement_timeout").format(ident))
    with pg.direct(user=role) as conn:
        conn.execute("SELECT etc_batch.add_step(%s, 'SELECT 1')", (f"owned_by_{role}",))


def test_statement_timeout_startup_parameter_does_not_reach_the_server(pg, bouncer, app_role):
    ident = sql.Identifier(app_role)
    prepare_app_role(pg, app_role)
    session_row = "statement_timeout (this session)"
    role_row = f"statement_timeout (role {app_role})"

    direct = pg.direct(user=app_role, options="-c statement_timeout=15s")
    assert direct.execute("SHOW statement_timeout").fetchone()[0] == "15s"
    rows = doctor_rows(direct)
    assert rows[session_row]["status"] == "ok", rows[session_row]
    assert "15s" in rows[session_row]["detail"] and "client" in rows[session_row]["detail"]
    # set by the client: the doctor says a pooler may not carry it
    assert "pooler" in (rows[session_row]["hint"] or ""), rows[session_row]

    pooled = bouncer.connect(pg.name, user=app_role, options="-c statement_timeout=15s")
    assert pooled.execute("SHOW statement_timeout").fetchone()[0] == "0"
    rows = doctor_rows(pooled)
    print(f"\nthrough pgbouncer: {rows[session_row]}\n  {rows[role_row]}")
    assert rows[session_row]["status"] == "warn", rows[session_row]
    assert "0" in rows[session_row]["detail"], rows[session_row]
    assert "ALTER ROLE" in rows[session_row]["hint"] and app_role in rows[session_row]["hint"], (
        rows[session_row])
    assert rows[role_row]["status"] == "warn", rows[role_row]
    assert "ALTER ROLE" in rows[role_row]["hint"] and app_role in rows[role_row]["hint"]

    # Do what the hint says, and let PgBouncer open fresh server connections.
    pg.admin.execute(sql.SQL("ALTER ROLE {} SET statement_timeout = '15s'").format(ident))
    bouncer.admin("RECONNECT")
    wait_until(
        lambda: pooled.execute("SHOW statement_timeout").fetchone()[0] == "15s",
        "a fresh server connection with the role's statement_timeout",
    )
    rows = doctor_rows(pooled)
    print(f"after ALTER ROLE: {rows[session_row]}\n  {rows[role_row]}")
    assert rows[session_row]["status"] == "ok", rows[session_row]
    assert "15s" in rows[session_row]["detail"], rows[session_row]
    assert rows[role_row]["status"] == "ok", rows[role_row]
    assert "15s" in rows[role_row]["detail"], rows[role_row]
    # A client that did not ask for it gets it too.
    fresh = bouncer.connect(pg.name, user=app_role)
    assert fresh.execute("SHOW statement_timeout").fetchone()[0] == "15s"


def test_doctor_role_row_is_what_a_new_session_gets_whoever_asks(pg, bouncer, app_role):
    """A role row says what a NEW session of that role gets. The session that runs the
    doctor may have been started with a statement_timeout of its own (options=-c ... in
    its connection string, PGOPTIONS), or get one from its own role: neither must leak
    into any role's row."""
    prepare_app_role(pg, app_role)
    pg.admin.execute("SELECT etc_batch.add_step('owned_by_postgres', 'SELECT 1')")
    app_row = f"statement_timeout (role {app_role})"
    postgres_row = "statement_timeout (role postgres)"
    # what new sessions really get, through the pooler and directly
    bouncer.admin("RECONNECT")  # server connections opened before the RESET go
    pooled = bouncer.connect(pg.name, user=app_role)
    wait_until(
        lambda: pooled.execute("SHOW statement_timeout").fetchone()[0] == "0",
        "fresh server connections without a role setting",
    )
    assert pg.direct(user=app_role).execute("SHOW statement_timeout").fetchone()[0] == "0"
    assert pg.direct().execute("SHOW statement_timeout").fetchone()[0] == "0"

    wrong = []

    def expect(asked_by, row_name, status, conn):
        row = doctor_rows(conn)[row_name]
        print(f"\nasked by {asked_by}: {row_name}: {row}")
        if row["status"] != status:
            wrong.append(f"asked by {asked_by}, {row_name!r} is {row['status']!r} ({row['detail']}), "
                         f"expected {status!r}")

    expect(f"{app_role} without options", app_row, "warn", pg.direct(user=app_role))
    for user in (app_role, "postgres"):
        conn = pg.direct(user=user, options="-c statement_timeout=15s")
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "15s"
        expect(f"{user} with -c statement_timeout=15s", app_row, "warn", conn)

    # the caller's own role setting is not the other roles' either
    pg.admin.execute(sql.SQL("ALTER ROLE {} SET statement_timeout = '15s'").format(sql.Identifier(app_role)))
    conn = pg.direct(user=app_role)
    assert conn.execute("SHOW statement_timeout").fetchone()[0] == "15s"
    expect(f"{app_role} with ALTER ROLE {app_role} SET statement_timeout", app_row, "ok", conn)
    expect(f"{app_role} with ALTER ROLE {app_role} SET statement_timeout", postgres_row, "warn", conn)

    assert not wrong, "\n".join(wrong)


# 6 ----------------------------------------------------------------------------------------


def test_leases_and_locks_views_through_pgbouncer(pg, bouncer):
    c1 = bouncer.connect(pg.name, row_factory=dict_row)
    c2 = bouncer.connect(pg.name, row_factory=dict_row)

    got = c1.execute(
        "SELECT * FROM etc_batch.acquire_lease('viewed', 'one', '30 seconds')"
    ).fetchone()
    assert got["acquired"] and got["generation"] == 1
    row = c2.execute(
        "SELECT holder, generation, expired, expires_in, acquired, renewed "
        "FROM etc_batch.leases WHERE name = 'viewed'"
    ).fetchone()
    assert (row["holder"], row["generation"], row["expired"]) == ("one", 1, False)
    assert datetime.timedelta(0) < row["expires_in"] <= datetime.timedelta(seconds=30)
    assert row["acquired"] == row["renewed"]

    with c1.transaction():
        assert c1.execute("SELECT etc_batch.try_xact_lock('orders', '42') AS ok").fetchone()["ok"] is True
        holder_pid = c1.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        assert c2.execute("SELECT etc_batch.try_xact_lock('orders', '42') AS ok").fetchone()["ok"] is False
        key = c2.execute("SELECT etc_batch.lock_key('orders', '42') AS k").fetchone()["k"]
        locks = c2.execute(
            "SELECT pid, granted, session_level FROM etc_batch.locks "
            "WHERE kind = 'advisory' AND stands_for = %s",
            (f"advisory key {key}",),
        ).fetchall()
        assert locks == [{"pid": holder_pid, "granted": True, "session_level": None}], locks
    # committed: the lock went with the transaction, not with a pooled session
    assert c2.execute("SELECT etc_batch.try_xact_lock('orders', '42') AS ok").fetchone()["ok"] is True
    assert c1.execute("SELECT etc_batch.try_xact_lock('orders', '42') AS ok").fetchone()["ok"] is True
