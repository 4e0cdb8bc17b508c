"""Chains run by clients: CALL etc_batch.exec_batch_from_id over real connections, with
concurrent runners, killed and cancelled backends, atomic contexts, failures, retries
and roles.

Every step command writes a row to side_effect (see conftest), so "ran exactly once"
is checked on the data the steps wrote, not only on etc_batch's own bookkeeping.
"""

import threading
import time

import psycopg
import pytest
from psycopg import errors, sql


def assert_audit_spans_disjoint(rows):
    """The audit rows of one step: the runners held the step's lock one after the
    other. A done row holds it over [lock_acquired_at, finished_at]; a skip is the
    instant lock_acquired_at."""
    for r in rows:
        assert r["lock_requested_at"] <= r["lock_acquired_at"], r
    spans = sorted(
        (r["lock_acquired_at"], r["finished_at"] or r["lock_acquired_at"], r["audit_id"])
        for r in rows
    )
    for (start1, end1, a1), (start2, end2, a2) in zip(spans, spans[1:]):
        assert start2 >= end1, (
            f"audit rows {a1} [{start1}, {end1}] and {a2} [{start2}, {end2}] of step "
            f"{rows[0]['step_id']} overlap"
        )
    done = [r for r in rows if r["outcome"] == "done"]
    for r in rows:
        if r["outcome"] == "skipped":
            assert r["lock_acquired_at"] >= done[0]["finished_at"], (
                f"skip {r['audit_id']} of step {r['step_id']} took the lock at "
                f"{r['lock_acquired_at']}, before the run finished at {done[0]['finished_at']}"
            )


def committed_notice(step_id, batch):
    return f'step {step_id} of batch "{batch}" committed'


def skipped_notice(step_id, batch):
    return f'step {step_id} of batch "{batch}" is already done, skipping'


# 1. concurrent runners ------------------------------------------------------------------


@pytest.mark.parametrize("callers", [2, 8])
def test_concurrent_runners_run_every_step_exactly_once(db, callers):
    batch = db.new_batch(f"concurrent{callers}")
    ids = db.add_side_chain(batch, 20, then="SELECT pg_sleep(0.01)")
    first = ids[0]

    barrier = threading.Barrier(callers)
    calls = [db.start_call(first, barrier=barrier) for _ in range(callers)]
    for call in calls:
        call.join()

    # every caller returned without error
    for call in calls:
        assert call.error is None, f"caller {call.pid}: {call.error!r}"

    # the steps' own writes: each exactly once
    assert db.side_counts(batch) == {k: 1 for k in range(1, 21)}
    side = {r["step"]: r for r in db.side_rows(batch)}
    assert len(side) == 20

    # every step done, on its first attempt
    steps = db.steps(batch)
    assert sorted(steps) == ids
    for step_id, row in steps.items():
        assert (row["status"], row["attempts"]) == ("done", 1), row

    audit = db.audit(batch)
    caller_pids = {c.pid for c in calls}
    assert {r["pid"] for r in audit} == caller_pids
    # each caller walked the whole chain: one audit row per step, run or skipped
    for pid in caller_pids:
        mine = [r["step_id"] for r in audit if r["pid"] == pid]
        assert sorted(mine) == ids, f"caller {pid} audited steps {mine}"

    done_txids = set()
    for k, step_id in enumerate(ids, start=1):
        rows = [r for r in audit if r["step_id"] == step_id]
        done = [r for r in rows if r["outcome"] == "done"]
        skipped = [r for r in rows if r["outcome"] == "skipped"]
        assert len(done) == 1, f"step {step_id}: {len(done)} done rows"
        assert len(skipped) == callers - 1, f"step {step_id}: {len(skipped)} skips"
        assert len(rows) == callers
        assert done[0]["status_seen"] == "pending" and done[0]["attempt"] == 1
        assert all(r["status_seen"] == "done" for r in skipped)
        # the side effect was written by the runner that marked the step done, in the
        # very transaction that did so
        assert side[k]["pid"] == done[0]["pid"]
        assert side[k]["txid"] == done[0]["txid"]
        done_txids.add(done[0]["txid"])
        assert_audit_spans_disjoint(rows)
    # one transaction per step
    assert len(done_txids) == 20

    # each caller was told what it committed and what it skipped
    for call in calls:
        ran = [r["step_id"] for r in audit if r["pid"] == call.pid and r["outcome"] == "done"]
        skips = [r["step_id"] for r in audit if r["pid"] == call.pid and r["outcome"] == "skipped"]
        assert [n for n in call.notices if n.endswith("committed")] == [
            committed_notice(i, batch) for i in ran
        ]
        assert [n for n in call.notices if n.endswith("skipping")] == [
            skipped_notice(i, batch) for i in skips
        ]


# 2. a backend killed in the middle of a step --------------------------------------------


def test_terminated_backend_leaves_step_pending_and_chain_resumes(db):
    batch = db.new_batch("kill")
    db.set_knob(batch, slow=True)
    commands = [db.side_command(batch, k) for k in (1, 2)]
    commands.append(db.side_command(batch, 3, then=db.slow_clause(batch)))
    commands += [db.side_command(batch, k) for k in (4, 5)]
    ids = db.add_steps(batch, commands)

    call = db.start_call(ids[0])
    db.wait_for_pg_sleep(call)
    # step 3 has written its side row (uncommitted) before it went to sleep
    assert db.holds_insert_lock(call.pid, "side_effect")
    killed = db.admin.execute("SELECT pg_terminate_backend(%s) AS ok", (call.pid,)).fetchone()
    assert killed["ok"] is True
    call.join()

    assert isinstance(call.error, psycopg.OperationalError), repr(call.error)
    assert call.conn.closed
    db.wait_for_exit(call.pid)
    db.assert_server_alive()

    assert db.side_counts(batch) == {1: 1, 2: 1}
    steps = db.steps(batch)
    assert [(steps[i]["status"], steps[i]["attempts"]) for i in ids] == [
        ("done", 1),
        ("done", 1),
        ("pending", 0),
        ("pending", 0),
        ("pending", 0),
    ]
    assert steps[ids[2]]["last_error"] is None and steps[ids[2]]["last_sqlstate"] is None
    assert {r["step_id"] for r in db.audit(batch)} == {ids[0], ids[1]}

    # the next run picks up at the step that was killed
    db.set_knob(batch, slow=False)
    notices = db.call(ids[0])
    assert notices == [
        skipped_notice(ids[0], batch),
        skipped_notice(ids[1], batch),
        committed_notice(ids[2], batch),
        committed_notice(ids[3], batch),
        committed_notice(ids[4], batch),
    ]
    assert db.side_counts(batch) == {k: 1 for k in range(1, 6)}
    steps = db.steps(batch)
    assert all((s["status"], s["attempts"]) == ("done", 1) for s in steps.values()), steps
    outcomes = [(r["step_id"], r["outcome"]) for r in db.audit(batch)]
    assert outcomes == [
        (ids[0], "done"),
        (ids[1], "done"),
        (ids[0], "skipped"),
        (ids[1], "skipped"),
        (ids[2], "done"),
        (ids[3], "done"),
        (ids[4], "done"),
    ]


# 3. readers are not blocked by a running step -------------------------------------------


def test_reading_batch_log_does_not_wait_for_a_running_step(db):
    batch = db.new_batch("reader")
    gate = db.gate()
    ids = db.add_steps(
        batch,
        [
            db.side_command(batch, 1),
            db.side_command(batch, 2, then=gate.command),
            db.side_command(batch, 3),
        ],
    )
    call = db.start_call(ids[0])
    try:
        db.wait_for_gate(call, gate)

        # the runner really holds step 2's row lock
        locker = db.connect()
        with pytest.raises(errors.LockNotAvailable):
            locker.execute(
                "SELECT 1 FROM etc_batch.batch_log WHERE id = %s FOR UPDATE NOWAIT", (ids[1],)
            )

        reader = db.connect()
        reader.execute("SET statement_timeout = '2s'")
        started = time.monotonic()
        rows = reader.execute(
            "SELECT id, status, attempts FROM etc_batch.batch_log WHERE batch = %s ORDER BY id",
            (batch,),
        ).fetchall()
        everything = reader.execute("SELECT * FROM etc_batch.batch_log").fetchall()
        elapsed = time.monotonic() - started
        assert elapsed < 2.0
        assert rows == [(ids[0], "done", 1), (ids[1], "pending", 0), (ids[2], "pending", 0)]
        assert {r[0] for r in everything} >= set(ids)
        call.check_running()
    finally:
        gate.open()
    call.join()
    assert call.error is None, repr(call.error)
    assert db.side_counts(batch) == {1: 1, 2: 1, 3: 1}
    assert all(s["status"] == "done" for s in db.steps(batch).values())


# 4. wait => false -------------------------------------------------------------------------


def test_no_wait_runner_returns_at_once_naming_the_holder(db):
    batch = db.new_batch("nowait")
    gate = db.gate()
    ids = db.add_steps(
        batch,
        [
            db.side_command(batch, 1),
            db.side_command(batch, 2, then=gate.command),
            db.side_command(batch, 3),
        ],
    )
    runner_a = db.start_call(ids[0])
    try:
        db.wait_for_gate(runner_a, gate)

        b = db.connect()
        b.execute("SET statement_timeout = '10s'")
        b_pid = b.info.backend_pid
        started = time.monotonic()
        notices = db.call(ids[1], wait=False, conn=b)
        elapsed = time.monotonic() - started
        runner_a.check_running()
    finally:
        gate.open()
    runner_a.join()

    assert elapsed < 5.0, f"wait => false took {elapsed:.1f}s"
    assert notices == [
        f'step {ids[1]} of batch "{batch}" is being run by process {runner_a.pid}, not waiting'
    ]
    assert runner_a.error is None, repr(runner_a.error)
    audit = db.audit(batch)
    assert [r for r in audit if r["pid"] == b_pid] == []
    assert [(r["step_id"], r["outcome"], r["pid"]) for r in audit] == [
        (i, "done", runner_a.pid) for i in ids
    ]
    assert db.side_counts(batch) == {1: 1, 2: 1, 3: 1}
    assert {r["pid"] for r in db.side_rows(batch)} == {runner_a.pid}


def test_no_wait_runner_runs_a_free_chain(db):
    batch = db.new_batch("nowaitfree")
    ids = db.add_side_chain(batch, 3)
    notices = db.call(ids[0], wait=False)
    assert notices == [committed_notice(i, batch) for i in ids]
    assert db.side_counts(batch) == {1: 1, 2: 1, 3: 1}


# 5. atomic contexts -------------------------------------------------------------------------


def _in_transaction_block(db, first, names):
    conn = db.connect(autocommit=False)
    try:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
    finally:
        conn.rollback()


def _in_do_block_with_exception_clause(db, first, names):
    db.connect().execute(
        f"""DO $$ BEGIN
              CALL etc_batch.exec_batch_from_id({int(first)});
            EXCEPTION WHEN division_by_zero THEN NULL;
            END $$"""
    )


def _in_routine(declaration, invocation):
    """CALLs the runner from inside a plpgsql routine `CREATE <declaration> ...`, run
    with `<invocation> name()`."""

    def run(db, first, name):
        conn = db.connect()
        conn.execute(
            sql.SQL(
                "CREATE " + declaration + " LANGUAGE plpgsql AS $$ BEGIN "
                "CALL etc_batch.exec_batch_from_id(" + str(int(first)) + "); END $$"
            ).format(sql.Identifier(name))
        )
        conn.execute(sql.SQL(invocation + " {}()").format(sql.Identifier(name)))

    return run


_in_function = _in_routine("FUNCTION {}() RETURNS void", "SELECT")
_in_procedure_with_set_clause = _in_routine("PROCEDURE {}() SET work_mem = '8MB'", "CALL")
_in_security_definer_procedure = _in_routine("PROCEDURE {}() SECURITY DEFINER", "CALL")


@pytest.mark.parametrize(
    "context",
    [
        _in_transaction_block,
        _in_do_block_with_exception_clause,
        _in_function,
        _in_procedure_with_set_clause,
        _in_security_definer_procedure,
    ],
    ids=[
        "transaction_block",
        "do_block_with_exception_clause",
        "function",
        "procedure_with_set_clause",
        "security_definer_procedure",
    ],
)
def test_atomic_context_is_refused_before_anything_runs(db, context):
    batch = db.new_batch("atomic")
    ids = db.add_side_chain(batch, 3)

    with pytest.raises(errors.InvalidTransactionTermination) as raised:
        context(db, ids[0], f"wrap_{batch}")
    assert raised.value.sqlstate == "2D000"
    assert raised.value.diag.message_hint, "the 2D000 error carries a hint"

    assert db.side_counts(batch) == {}
    steps = db.steps(batch)
    assert all((s["status"], s["attempts"]) == ("pending", 0) for s in steps.values()), steps
    assert db.audit(batch) == []

    # the same chain runs when CALLed where it can commit
    db.call(ids[0])
    assert db.side_counts(batch) == {1: 1, 2: 1, 3: 1}


# 6. orchestrators -------------------------------------------------------------------------


def test_orchestrator_calling_the_runner_twice_runs_each_step_once(db):
    batch = db.new_batch("orch")
    ids = db.add_side_chain(batch, 4)
    proc = f"orchestrate_{batch}"
    conn = db.connect()
    conn.execute(
        sql.SQL(
            """CREATE PROCEDURE {}(first bigint) LANGUAGE plpgsql AS $$
               BEGIN
                 CALL etc_batch.exec_batch_from_id(first);
                 CALL etc_batch.exec_batch_from_id(first);
               END $$"""
        ).format(sql.Identifier(proc))
    )
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    conn.execute(sql.SQL("CALL {}(%s)").format(sql.Identifier(proc)), (ids[0],))

    assert db.side_counts(batch) == {k: 1 for k in range(1, 5)}
    steps = db.steps(batch)
    assert all((s["status"], s["attempts"]) == ("done", 1) for s in steps.values()), steps
    audit = db.audit(batch)
    # first pass runs every step, second pass only skips
    assert [(r["step_id"], r["outcome"]) for r in audit] == [(i, "done") for i in ids] + [
        (i, "skipped") for i in ids
    ]
    assert {r["pid"] for r in audit} == {conn.info.backend_pid}
    # still one transaction per step
    assert len({r["txid"] for r in audit if r["outcome"] == "done"}) == len(ids)
    assert notices == [committed_notice(i, batch) for i in ids] + [
        skipped_notice(i, batch) for i in ids
    ]


def test_orchestrator_runs_two_chains_one_after_the_other(db):
    batch_a = db.new_batch("orch_a")
    batch_b = db.new_batch("orch_b")
    ids_a = db.add_side_chain(batch_a, 3)
    ids_b = db.add_side_chain(batch_b, 3)
    proc = f"orchestrate_{batch_a}"
    conn = db.connect()
    conn.execute(
        sql.SQL(
            """CREATE PROCEDURE {}(a bigint, b bigint) LANGUAGE plpgsql AS $$
               BEGIN
                 CALL etc_batch.exec_batch_from_id(a);
                 CALL etc_batch.exec_batch_from_id(b);
               END $$"""
        ).format(sql.Identifier(proc))
    )
    conn.execute(sql.SQL("CALL {}(%s, %s)").format(sql.Identifier(proc)), (ids_a[0], ids_b[0]))

    assert db.side_counts(batch_a) == {1: 1, 2: 1, 3: 1}
    assert db.side_counts(batch_b) == {1: 1, 2: 1, 3: 1}
    for batch in (batch_a, batch_b):
        steps = db.steps(batch)
        assert all((s["status"], s["attempts"]) == ("done", 1) for s in steps.values()), steps
    audit_a, audit_b = db.audit(batch_a), db.audit(batch_b)
    assert [(r["step_id"], r["outcome"]) for r in audit_a] == [(i, "done") for i in ids_a]
    assert [(r["step_id"], r["outcome"]) for r in audit_b] == [(i, "done") for i in ids_b]
    # chain b started after chain a had finished
    assert max(r["audit_id"] for r in audit_a) < min(r["audit_id"] for r in audit_b)
    assert max(r["finished_at"] for r in audit_a) <= min(r["lock_acquired_at"] for r in audit_b)


# 7. failure and retry -----------------------------------------------------------------------


def test_failed_step_is_recorded_blocks_the_chain_and_can_be_retried(db):
    batch = db.new_batch("fail")
    db.set_knob(batch, divisor=0)
    ids = db.add_steps(
        batch,
        [
            db.side_command(batch, 1),
            db.side_command(batch, 2, then=db.divide_clause(batch)),
            db.side_command(batch, 3),
        ],
    )

    with pytest.raises(errors.DivisionByZero) as raised:
        db.call(ids[0])
    assert raised.value.sqlstate == "22012"

    steps = db.steps(batch)
    assert (steps[ids[0]]["status"], steps[ids[0]]["attempts"]) == ("done", 1)
    failed = steps[ids[1]]
    assert (failed["status"], failed["attempts"], failed["last_sqlstate"]) == ("failed", 1, "22012")
    assert "division by zero" in failed["last_error"]
    assert (steps[ids[2]]["status"], steps[ids[2]]["attempts"]) == ("pending", 0)
    assert db.side_counts(batch) == {1: 1}
    audit = db.audit(batch)
    assert [(r["step_id"], r["outcome"], r["attempt"], r["sqlstate"]) for r in audit] == [
        (ids[0], "done", 1, None),
        (ids[1], "failed", 1, "22012"),
    ]
    assert "division by zero" in audit[1]["error"]

    # the chain stops at the failed step until it is retried
    with pytest.raises(errors.ObjectNotInPrerequisiteState) as raised:
        db.call(ids[0])
    assert raised.value.sqlstate == "55000"
    assert raised.value.diag.message_primary == f'step {ids[1]} of batch "{batch}" has failed'
    steps = db.steps(batch)
    assert (steps[ids[1]]["status"], steps[ids[1]]["attempts"]) == ("failed", 1)
    assert (steps[ids[2]]["status"], steps[ids[2]]["attempts"]) == ("pending", 0)
    assert db.side_counts(batch) == {1: 1}

    # only a failed step can be retried
    with pytest.raises(errors.ObjectNotInPrerequisiteState):
        db.admin.execute("SELECT etc_batch.retry_step(%s)", (ids[0],))

    db.set_knob(batch, divisor=1)
    db.admin.execute("SELECT etc_batch.retry_step(%s)", (ids[1],))
    assert db.steps(batch)[ids[1]]["status"] == "pending"
    db.call(ids[0])

    steps = db.steps(batch)
    assert [(steps[i]["status"], steps[i]["attempts"]) for i in ids] == [
        ("done", 1),
        ("done", 2),
        ("done", 1),
    ]
    assert db.side_counts(batch) == {1: 1, 2: 1, 3: 1}
    step2 = [(r["outcome"], r["attempt"]) for r in db.audit(batch) if r["step_id"] == ids[1]]
    assert step2 == [("failed", 1), ("done", 2)]


# 8. steps run as the role that added them -----------------------------------------------------


def _grant_add_step(db, role):
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(sql.Identifier(role)))
    db.admin.execute(
        sql.SQL("GRANT EXECUTE ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer) TO {}").format(
            sql.Identifier(role)
        )
    )


def _add_step_as(db, role, batch, command):
    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    step_id = conn.execute("SELECT etc_batch.add_step(%s, %s)", (batch, command)).fetchone()[0]
    conn.execute("RESET ROLE")
    return step_id


def test_step_runs_with_the_privileges_of_the_role_that_added_it(db, roles):
    low = roles("low")
    _grant_add_step(db, low)
    secret = f"secret_{low}"
    db.admin.execute(sql.SQL("CREATE TABLE {} (v int)").format(sql.Identifier(secret)))

    batch = db.new_batch("priv")
    (first,) = db.add_steps(batch, [db.side_command(batch, 1)])
    insert_secret = sql.SQL("INSERT INTO {} VALUES (1)").format(sql.Identifier(secret))
    low_step = _add_step_as(db, low, batch, insert_secret.as_string(None))
    assert db.steps(batch)[low_step]["added_by"] == low

    with pytest.raises(errors.InsufficientPrivilege) as raised:
        db.call(first)
    assert raised.value.sqlstate == "42501"

    count = db.admin.execute(
        sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(secret))
    ).fetchone()["n"]
    assert count == 0
    steps = db.steps(batch)
    assert (steps[first]["status"], steps[low_step]["status"]) == ("done", "failed")
    assert steps[low_step]["last_sqlstate"] == "42501"
    failed = [r for r in db.audit(batch) if r["step_id"] == low_step]
    assert [(r["outcome"], r["ran_as"], r["run_by"], r["sqlstate"]) for r in failed] == [
        ("failed", low, "postgres", "42501")
    ]


def test_current_user_inside_a_step_is_the_role_that_added_it(db, roles):
    writer = roles("writer")
    _grant_add_step(db, writer)
    who = f"who_{writer}"
    db.admin.execute(sql.SQL("CREATE TABLE {} (step int, name name)").format(sql.Identifier(who)))
    db.admin.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(sql.Identifier(who), sql.Identifier(writer)))

    def record(step):
        return (
            sql.SQL("INSERT INTO {} VALUES ({}, current_user)")
            .format(sql.Identifier(who), sql.Literal(step))
            .as_string(None)
        )

    batch = db.new_batch("whoami")
    (by_postgres,) = db.add_steps(batch, [record(1)])
    by_writer = _add_step_as(db, writer, batch, record(2))

    db.call(by_postgres)

    names = db.admin.execute(
        sql.SQL("SELECT step, name::text AS name FROM {} ORDER BY step").format(sql.Identifier(who))
    ).fetchall()
    assert [(r["step"], r["name"]) for r in names] == [(1, "postgres"), (2, writer)]
    audit = db.audit(batch)
    assert [(r["step_id"], r["outcome"], r["ran_as"], r["run_by"]) for r in audit] == [
        (by_postgres, "done", "postgres", "postgres"),
        (by_writer, "done", writer, "postgres"),
    ]


def test_non_superuser_runner_runs_steps_as_their_adder(db, roles):
    writer = roles("adder")
    runner = roles("runner")
    _grant_add_step(db, writer)
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(sql.Identifier(runner)))
    db.admin.execute(
        sql.SQL("GRANT EXECUTE ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean, text, text, bigint) TO {}").format(
            sql.Identifier(runner)
        )
    )
    target = f"target_{writer}"
    db.admin.execute(sql.SQL("CREATE TABLE {} (name name)").format(sql.Identifier(target)))
    db.admin.execute(
        sql.SQL("GRANT INSERT ON {} TO {}").format(sql.Identifier(target), sql.Identifier(writer))
    )

    batch = db.new_batch("runner")
    command = sql.SQL("INSERT INTO {} VALUES (current_user)").format(sql.Identifier(target))
    step_id = _add_step_as(db, writer, batch, command.as_string(None))

    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(runner)))
    # the runner itself may not write the table the step writes
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute(command)
    db.call(step_id, conn=conn)

    rows = db.admin.execute(
        sql.SQL("SELECT name::text AS name FROM {}").format(sql.Identifier(target))
    ).fetchall()
    assert [r["name"] for r in rows] == [writer]
    audit = db.audit(batch)
    assert [(r["outcome"], r["ran_as"], r["run_by"]) for r in audit] == [("done", writer, runner)]


# 9. bad input ---------------------------------------------------------------------------------


def _step_count(db):
    return db.admin.execute("SELECT count(*) AS n FROM etc_batch.batch_log").fetchone()["n"]


def test_bad_input_is_rejected_with_specific_errors(db):
    batch = db.new_batch("bad")
    (first,) = db.add_side_chain(batch, 1)
    before = _step_count(db)

    with pytest.raises(errors.NullValueNotAllowed):
        db.call(None)
    with pytest.raises(errors.NullValueNotAllowed):
        db.connect().execute("CALL etc_batch.exec_batch_from_id(%s, NULL)", (first,))
    unknown = db.admin.execute(
        "SELECT coalesce(max(id), 0) + 1000 AS id FROM etc_batch.batch_log"
    ).fetchone()["id"]
    with pytest.raises(errors.UndefinedObject) as raised:
        db.call(unknown)
    assert str(unknown) in raised.value.diag.message_primary

    with pytest.raises(errors.SyntaxError):
        db.admin.execute("SELECT etc_batch.add_step(%s, %s)", (batch, "SELEC 1"))
    with pytest.raises(errors.InvalidParameterValue):
        db.admin.execute("SELECT etc_batch.add_step(%s, %s)", (batch, "COMMIT"))
    with pytest.raises(errors.InvalidParameterValue):
        db.admin.execute(
            "SELECT etc_batch.add_step(%s, %s)", (batch, db.side_command(batch, 2, then="COMMIT"))
        )

    assert _step_count(db) == before
    assert list(db.steps(batch)) == [first]
    # nothing ran either
    assert db.side_counts(batch) == {}
    assert db.audit(batch) == []


# 10. cancelled steps ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["pg_cancel_backend", "statement_timeout"])
def test_cancelled_step_stays_pending_and_chain_resumes(db, how):
    batch = db.new_batch(f"cancel_{how}")
    db.set_knob(batch, slow=True)
    ids = db.add_steps(
        batch,
        [
            db.side_command(batch, 1),
            db.side_command(batch, 2),
            db.side_command(batch, 3, then=db.slow_clause(batch)),
            db.side_command(batch, 4),
        ],
    )

    if how == "pg_cancel_backend":
        call = db.start_call(ids[0])
        db.wait_for_pg_sleep(call)
        cancelled = db.admin.execute("SELECT pg_cancel_backend(%s) AS ok", (call.pid,)).fetchone()
        assert cancelled["ok"] is True
    else:
        call = db.start_call(ids[0], settings=["SET statement_timeout = '4s'"])
    call.join()

    assert isinstance(call.error, errors.QueryCanceled), repr(call.error)
    assert call.error.sqlstate == "57014"
    # a cancel ends the statement, not the session
    assert call.conn.execute("SELECT 1").fetchone() == (1,)
    db.assert_server_alive()

    assert db.side_counts(batch) == {1: 1, 2: 1}
    steps = db.steps(batch)
    assert [(steps[i]["status"], steps[i]["attempts"]) for i in ids] == [
        ("done", 1),
        ("done", 1),
        ("pending", 0),
        ("pending", 0),
    ]
    assert steps[ids[2]]["last_sqlstate"] is None
    audit = db.audit(batch)
    assert [(r["step_id"], r["outcome"]) for r in audit] == [(ids[0], "done"), (ids[1], "done")]
    assert not [r for r in audit if r["outcome"] == "failed"]

    # a later call finishes the chain, running each remaining step once
    call.conn.execute("RESET statement_timeout")
    db.set_knob(batch, slow=False)
    db.call(ids[0], conn=call.conn)
    assert db.side_counts(batch) == {1: 1, 2: 1, 3: 1, 4: 1}
    steps = db.steps(batch)
    assert all((s["status"], s["attempts"]) == ("done", 1) for s in steps.values()), steps
    assert [(r["step_id"], r["outcome"]) for r in db.audit(batch)] == [
        (ids[0], "done"),
        (ids[1], "done"),
        (ids[0], "skipped"),
        (ids[1], "skipped"),
        (ids[2], "done"),
        (ids[3], "done"),
    ]


# settings changed by a step -------------------------------------------------------------------


def test_settings_changed_by_a_step_do_not_reach_the_callers_session(db):
    batch = db.new_batch("settings")
    ids = db.add_steps(
        batch,
        [
            "SET work_mem = '77MB'",
            "SELECT set_config('work_mem', '99MB', false)",
            f"INSERT INTO side_effect(batch, step) SELECT {db.lit(batch)}, 3 "
            "WHERE current_setting('work_mem') NOT IN ('77MB', '99MB')",
        ],
    )
    conn = db.connect()
    conn.execute("SET work_mem = '5MB'")
    db.call(ids[0], conn=conn)
    assert conn.execute("SHOW work_mem").fetchone() == ("5MB",)
    # and one step's setting did not reach the next step
    assert db.side_counts(batch) == {3: 1}


def test_a_search_path_set_by_a_step_ends_with_it(db):
    # The steps keep the search_path of the session that added them, which is the
    # caller's here: the runner leaves a setting that already holds its value as it is,
    # and what a step sets must end with the step all the same.
    batch = db.new_batch("search_path")
    path = db.admin.execute("SHOW search_path").fetchone()
    path = path["search_path"] if isinstance(path, dict) else path[0]
    ids = db.add_steps(
        batch,
        [
            "SET search_path = pg_catalog",
            f"INSERT INTO public.side_effect(batch, step) SELECT {db.lit(batch)}, 2 "
            f"WHERE current_setting('search_path') = {db.lit(path)}",
        ],
    )
    conn = db.connect()
    assert conn.execute("SHOW search_path").fetchone() == (path,)
    db.call(ids[0], conn=conn)
    assert conn.execute("SHOW search_path").fetchone() == (path,)
    assert db.side_counts(batch) == {2: 1}


def test_a_step_that_only_reads_takes_no_transaction_id_of_its_own(db):
    # One transaction id per step, its transaction's, taken by the lock on the step's
    # row: the subtransaction the command runs in asks for none unless it writes.
    batch = db.new_batch("xids")
    ids = db.add_steps(batch, ["SELECT 1", "SELECT count(*) FROM pg_class", "SELECT 1"])
    conn = db.connect()
    next_xid = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
    before = conn.execute(next_xid).fetchone()[0]
    db.call(ids[0], conn=conn)
    after = conn.execute(next_xid).fetchone()[0]
    assert after - before == 3
    assert db.steps(batch)[ids[2]]["status"] == "done"


# 10. etc_batch's own writes --------------------------------------------------------------


def test_triggers_on_the_chain_tables_see_every_write(db):
    """A step's done mark and its audit row are written without a statement, except
    where the table has a trigger for the write: then through one, so that a trigger a
    DBA put on batch_log or step_audit sees every step, failed ones included."""
    batch = db.new_batch("triggers")
    seen = sql.Identifier(f"{batch}_seen")
    fn = sql.Identifier(f"{batch}_note")
    db.set_knob(batch, divisor=0)
    ids = db.add_steps(batch, [
        db.side_command(batch, 1),
        db.side_command(batch, 2),
        db.side_command(batch, 3, then=db.divide_clause(batch)),
    ])
    db.admin.execute(sql.SQL("CREATE TABLE {} (tbl text, op text, row jsonb)").format(seen))
    db.admin.execute(sql.SQL(
        "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO {seen} VALUES (TG_TABLE_NAME, TG_OP, to_jsonb(NEW)); RETURN NULL; END $$"
    ).format(fn=fn, seen=seen))
    triggers = [("batch_log", "UPDATE"), ("step_audit", "INSERT")]
    try:
        for table, op in triggers:
            db.admin.execute(sql.SQL(
                "CREATE TRIGGER seen AFTER {op} ON etc_batch.{t} FOR EACH ROW EXECUTE FUNCTION {fn}()"
            ).format(op=sql.SQL(op), t=sql.Identifier(table), fn=fn))
        with pytest.raises(errors.DivisionByZero):
            db.call(ids[0])
        rows = db.admin.execute(sql.SQL("SELECT tbl, op, row FROM {}").format(seen)).fetchall()
        marks = sorted((r["row"]["id"], r["row"]["status"]) for r in rows if r["tbl"] == "batch_log")
        audit = sorted((r["row"]["step_id"], r["row"]["outcome"]) for r in rows if r["tbl"] == "step_audit")
        assert marks == [(ids[0], "done"), (ids[1], "done"), (ids[2], "failed")]
        assert audit == [(ids[0], "done"), (ids[1], "done"), (ids[2], "failed")]
        assert [(r["step_id"], r["outcome"]) for r in db.audit(batch)] == audit
    finally:
        for table, _ in triggers:
            db.admin.execute(sql.SQL("DROP TRIGGER IF EXISTS seen ON etc_batch.{}").format(
                sql.Identifier(table)))
    assert db.side_counts(batch) == {1: 1, 2: 1}


def test_a_column_added_to_step_audit_stops_the_runner_cleanly(db):
    """etc_batch writes step_audit's columns itself: a column added by hand is refused
    (55000), with the step rolled back and still pending, never a row written without
    it; once the column is dropped again the chain runs."""
    batch = db.new_batch("audit_column")
    ids = db.add_steps(batch, [db.side_command(batch, 1), db.side_command(batch, 2)])
    db.admin.execute("ALTER TABLE etc_batch.step_audit ADD COLUMN note text")
    try:
        with pytest.raises(errors.ObjectNotInPrerequisiteState) as refused:
            db.call(ids[0])
        assert refused.value.diag.message_primary == (
            "table etc_batch.step_audit does not have the columns etc_batch writes")
        assert refused.value.diag.message_detail.startswith('Column "note" was added')
        steps = db.steps(batch)
        assert [(steps[i]["status"], steps[i]["attempts"]) for i in ids] == [("pending", 0)] * 2
        assert db.side_counts(batch) == {}
        assert db.audit(batch) == []
    finally:
        db.admin.execute("ALTER TABLE etc_batch.step_audit DROP COLUMN IF EXISTS note")
    # a dropped column stays in the row type, invisible: the writer leaves it NULL
    db.call(ids[0])
    assert db.side_counts(batch) == {1: 1, 2: 1}
    assert [(r["step_id"], r["outcome"]) for r in db.audit(batch)] == [
        (ids[0], "done"), (ids[1], "done")]


def test_steps_run_in_id_order_even_without_system_indexes(db):
    """The runner reads "the next step" by batch_log's primary key itself, never by a
    catalog scan that falls back to the heap, in no order, when a session starts with
    ignore_system_indexes (which any role may set): steps added out of id order still
    run in id order, each once."""
    batch = db.new_batch("noindexes")
    base = db.admin.execute("SELECT coalesce(max(id), 0) + 10 AS base FROM etc_batch.batch_log").fetchone()["base"]
    # added 3, 1, 2: the heap holds them in that order
    for k in (3, 1, 2):
        db.admin.execute("SELECT etc_batch.add_step(%s, %s, %s)",
                         (batch, db.side_command(batch, k), base + k))
    conn = db.connect(options="-c ignore_system_indexes=on")
    assert conn.execute("SHOW ignore_system_indexes").fetchone()[0] == "on"
    notices = db.call(base + 1, conn=conn)
    assert notices == [committed_notice(base + k, batch) for k in (1, 2, 3)]
    assert db.side_counts(batch) == {1: 1, 2: 1, 3: 1}
    assert [(r["step_id"], r["outcome"]) for r in db.audit(batch)] == [
        (base + k, "done") for k in (1, 2, 3)]
