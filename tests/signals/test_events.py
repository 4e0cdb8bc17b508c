"""NOTIFY etc_batch, heard by a real LISTENing client: every event of a job's life, of a
chain and of a launch arrives once, in the order the changes committed, with its JSON
payload; nothing is heard of a change that rolled back, and nothing per chunk. By
default a payload says only the kind, the event and a number, to any role that can
connect; with etc_batch.event_detail = full, what happened in full."""

import json
import time

import psycopg
import pytest
from psycopg import sql

from support import close_quietly, wait_until
from test_signals import Call, make_orders, register, tag

# What a payload may say by default: no name, no role, no reason, message or SQLSTATE.
PRIVATE_KEYS = {"kind", "event", "job_number", "step", "launch_id"}


@pytest.fixture
def full_detail(signals):
    """etc_batch.event_detail = full for the sessions and workers that connect from now
    on, as a superuser sets it for a database; back to the default afterwards."""
    with signals.connect() as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET etc_batch.event_detail = full")
                      .format(sql.Identifier(signals.test_db)))
    yield
    with signals.connect() as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} RESET etc_batch.event_detail")
                      .format(sql.Identifier(signals.test_db)))


class Listener:
    """A session of its own that LISTENs on etc_batch (a direct connection: a
    transaction-mode pooler would hand it to others between transactions)."""

    def __init__(self, cluster, role=None):
        if role is None:
            self.conn = cluster.connect()
        else:
            self.conn = psycopg.connect(host=str(cluster.socket_dir), port=cluster.port, user=role,
                                        dbname=cluster.test_db, autocommit=True, connect_timeout=10)
        self.conn.execute("LISTEN etc_batch")
        self.heard = []
        self.payloads = []

    def hear(self, quiet=1.0):
        """Everything sent until `quiet` seconds pass with nothing more."""
        for n in self.conn.notifies(timeout=quiet):
            assert n.channel == "etc_batch"
            self.payloads.append(n.payload)
            self.heard.append(json.loads(n.payload))
        return self.heard

    def of(self, **match):
        return [e for e in self.heard if all(e.get(k) == v for k, v in match.items())]


def refuse(conn, table, item, message):
    """A trigger on `table` that refuses to update `item` with `message` (P0001), unless
    the session says test.refuse = off."""
    conn.execute(sql.SQL(
        "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.id = {i} AND current_setting('test.refuse', true) IS DISTINCT FROM 'off' "
        "THEN RAISE EXCEPTION {m} USING ERRCODE = 'P0001'; END IF; RETURN NEW; END $$; "
        "CREATE TRIGGER refuse BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {f}()").format(
        f=sql.Identifier(f"refuse_{table}"), t=sql.Identifier(table), i=sql.Literal(item),
        m=sql.Literal(message)))


def events(heard, key, value):
    """The events of one job, chain or launch (a launch's events name its job too)."""
    kind = {"job_id": "job", "batch": "chain", "launch_id": "launch"}[key]
    return [e["event"] for e in heard if e["kind"] == kind and e.get(key) == value]


def test_every_event_of_a_job_arrives_once_in_order_and_none_for_a_rollback(signals, full_detail):
    admin = signals.connect()
    listener = Listener(signals)
    try:
        table = make_orders(admin, 60)
        # a trigger that refuses item 25 for a while: one chunk fails and is rolled back
        refuse(admin, table, 25, "item 25 is held")
        job = register(admin, table, 60, 10, "events")
        # a pause that rolls back is never heard of
        with signals.connect(autocommit=False) as undone:
            undone.execute("SELECT etc_batch.pause_job(%s)", (job,))
            undone.rollback()
        admin.execute("SELECT etc_batch.pause_job(%s)", (job,))
        admin.execute("SELECT etc_batch.resume_job(%s)", (job,))
        drainer = signals.connect()
        try:
            drainer.execute("CALL etc_batch.drain_job(%s)", (job,))
            raise AssertionError("the chunk holding item 25 committed")
        except psycopg.errors.RaiseException:
            pass
        # a throttle query that says wait, then lets go
        admin.execute("CREATE TABLE IF NOT EXISTS gate (closed boolean NOT NULL)")
        admin.execute("TRUNCATE gate; INSERT INTO gate VALUES (true)")
        admin.execute("SELECT etc_batch.pace_job(%s, throttle_query => 'SELECT closed FROM gate')", (job,))
        drainer.execute("SET test.refuse = off")
        drain = Call(drainer, "CALL etc_batch.drain_job(%s)", (job,))
        wait_until(lambda: any(e["event"] == "waiting" for e in listener.hear(0.2)), "the wait to be heard")
        admin.execute("UPDATE gate SET closed = false")
        assert drain.join()[4] == "done"
        heard = listener.hear()
        mine = [e for e in heard if e.get("job_id") == job]
        assert [e["event"] for e in mine] == [
            "registered", "paused", "resumed", "started", "failed", "waiting", "waited", "done"], mine
        registered, paused, resumed, started, failed, waiting, waited, done = mine
        assert (registered["items"], registered["chunks"], registered["by"]) == (60, 6, "postgres")
        assert paused["by"] == "postgres" and "reason" not in paused
        assert started["chunks"] == 6
        assert (failed["chunk"], failed["sqlstate"], failed["message"]) == (3, "P0001", "item 25 is held")
        assert waiting["for"] == "throttle_query" and waiting["reason"] == "its throttle_query says to wait"
        assert waited["for"] == "throttle_query" and waited["seconds"] > 0
        number = admin.execute("SELECT job_number FROM etc_batch.job WHERE job_id = %s",
                               (job,)).fetchone()[0]
        assert done == {"kind": "job", "job_number": number, "job_id": job, "event": "done",
                        "items": 60}
        assert all(e["kind"] == "job" for e in mine)
    finally:
        close_quietly([listener.conn, admin])


def test_signals_conflicts_chains_and_launches_are_heard(signals, full_detail):
    admin = signals.connect()
    listener = Listener(signals)
    try:
        # a critical signal pauses the job: heard with its reason
        table = make_orders(admin, 30)
        job = register(admin, table, 30, 10, "critical")
        admin.execute("SELECT etc_batch.pace_job(%s, critical_query => 'SELECT true')", (job,))
        assert signals.connect().execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4] == "paused"
        # a row the application changed since the approval: the job stops in conflict
        other = register(admin, table, 30, 10, "conflict")
        admin.execute(sql.SQL("UPDATE {} SET revision = revision + 1 WHERE id = 15").format(
            sql.Identifier(table)))
        try:
            signals.connect().execute("CALL etc_batch.drain_job(%s)", (other,))
        except psycopg.errors.Error:
            pass
        admin.execute("SELECT etc_batch.abort_job(%s, 'approved again')", (other,))
        # a chain: a step that fails, retried, then the chain done
        batch = tag("nightly")
        admin.execute("CREATE TABLE IF NOT EXISTS divisor (d int); TRUNCATE divisor; INSERT INTO divisor VALUES (0)")
        first = admin.execute("SELECT etc_batch.add_step(%s, 'SELECT 1')", (batch,)).fetchone()[0]
        failing = admin.execute("SELECT etc_batch.add_step(%s, 'SELECT 1 / d FROM divisor')",
                                (batch,)).fetchone()[0]
        try:
            signals.connect().execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
        except psycopg.errors.DivisionByZero:
            pass
        admin.execute("UPDATE divisor SET d = 1")
        admin.execute("SELECT etc_batch.retry_step(%s)", (failing,))
        signals.connect().execute("CALL etc_batch.exec_batch_from_id(%s)", (failing,))
        # a launch, from start to end
        launched = register(admin, make_orders(admin, 40), 40, 10, "launched")
        launch_id = admin.execute("SELECT launch_id FROM etc_batch.launch_job(%s)", (launched,)).fetchone()[0]
        wait_until(lambda: any(e.get("launch_id") == launch_id and e["event"] == "ended"
                               for e in listener.hear(0.2)), "the launch's end to be heard")
        heard = listener.hear()

        assert events(heard, "job_id", job) == ["registered", "paused"], heard
        paused = listener.of(job_id=job, event="paused")[0]
        number = admin.execute("SELECT job_number FROM etc_batch.job WHERE job_id = %s",
                               (job,)).fetchone()[0]
        assert paused == {"kind": "job", "job_number": number, "job_id": job, "event": "paused",
                          "by": "etc_batch", "reason": "its critical_query returned true"}, paused
        assert events(heard, "job_id", other) == ["registered", "started", "conflict", "aborted"], heard
        conflict = listener.of(job_id=other, event="conflict")[0]
        assert "15" in conflict["reason"], conflict
        assert events(heard, "batch", batch) == ["step failed", "done"], heard
        failed = listener.of(batch=batch, event="step failed")[0]
        assert (failed["step"], failed["sqlstate"], failed["message"]) == (
            failing, "22012", "division by zero")
        assert listener.of(batch=batch, event="done")[0]["last_step"] == failing
        assert listener.of(batch=batch, event="done")[0]["step"] == failing
        assert events(heard, "launch_id", launch_id) == ["started", "ended"], heard
        started = listener.of(launch_id=launch_id, event="started")[0]
        assert (started["job_id"], started["workers"]) == (launched, 1)
        assert listener.of(launch_id=launch_id, event="ended")[0]["status"] == "done"
        # nothing per chunk: a job of 4 chunks says registered, started and done, no more
        assert events(heard, "job_id", launched) == ["registered", "started", "done"], heard
    finally:
        close_quietly([listener.conn, admin])


def test_a_listener_that_may_not_see_a_job_hears_only_numbers(signals):
    """Any role that can connect may LISTEN (PostgreSQL checks no privilege for it). With
    etc_batch.event_detail at its default, a role with no privilege but USAGE on the
    schema hears, of a job's whole life, a chain's failed step and a launch, the kind,
    the event and a number: never a job id, a batch, a role, a reason, a message or a
    SQLSTATE. The job's registrant turns the number into its job in job_progress; the
    listener finds nothing there."""
    admin = signals.connect()
    nobody, clerk = tag("nobody"), tag("clerk")
    for role in (nobody, clerk):
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(sql.Identifier(role)))
    admin.execute(sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA etc_batch TO {0}; "
                          "GRANT EXECUTE ON ALL PROCEDURES IN SCHEMA etc_batch TO {0}")
                  .format(sql.Identifier(clerk)))
    listener = Listener(signals, nobody)
    # nor can it ask for more
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        listener.conn.execute("SET etc_batch.event_detail = full")
    as_clerk = signals.connect()
    as_clerk.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(clerk)))
    try:
        table = make_orders(admin, 30)
        admin.execute(sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(
            sql.Identifier(table), sql.Identifier(clerk)))
        # a chunk refused with a message that holds a row's values
        refuse(admin, table, 15, "salary of item 15 is 9000")
        job = register(as_clerk, table, 30, 10, "payroll_cut")
        as_clerk.execute("SELECT etc_batch.pause_job(%s)", (job,))
        as_clerk.execute("SELECT etc_batch.resume_job(%s)", (job,))
        try:
            as_clerk.execute("CALL etc_batch.drain_job(%s)", (job,))
            raise AssertionError("the chunk holding item 15 committed")
        except psycopg.errors.RaiseException:
            pass
        as_clerk.execute("SELECT etc_batch.abort_job(%s, 'approved by mistake')", (job,))
        # a chain's failed step, and a launch from start to end
        batch = tag("nightly_payroll")
        first = admin.execute("SELECT etc_batch.add_step(%s, 'SELECT 1 / 0')", (batch,)).fetchone()[0]
        try:
            signals.connect().execute("CALL etc_batch.exec_batch_from_id(%s)", (first,))
        except psycopg.errors.DivisionByZero:
            pass
        launched = register(admin, make_orders(admin, 20), 20, 10, "launched_payroll")
        launch_id = admin.execute("SELECT launch_id FROM etc_batch.launch_job(%s)",
                                  (launched,)).fetchone()[0]
        wait_until(lambda: any(e.get("launch_id") == launch_id and e["event"] == "ended"
                               for e in listener.hear(0.2)), "the launch's end to be heard")
        heard = listener.hear()

        for payload, event in zip(listener.payloads, heard):
            assert set(event) <= PRIVATE_KEYS, event
            for secret in (job, batch, launched, clerk, "postgres", "salary", "9000", "P0001",
                           "22012", "mistake", "division"):
                assert secret not in payload, (secret, payload)
        number = as_clerk.execute("SELECT job_number FROM etc_batch.job_progress WHERE job_id = %s",
                                  (job,)).fetchone()[0]
        assert [e["event"] for e in heard if e.get("job_number") == number] == [
            "registered", "paused", "resumed", "started", "failed", "aborted"], heard
        assert {"kind": "chain", "step": first, "event": "step failed"} in heard, heard
        assert [e for e in heard if e.get("launch_id") == launch_id] == [
            {"kind": "launch", "launch_id": launch_id, "event": "started"},
            {"kind": "launch", "launch_id": launch_id, "event": "ended"}], heard
        # the registrant finds its job by the number; the listener finds nothing
        assert as_clerk.execute("SELECT job_id FROM etc_batch.job_progress WHERE job_number = %s",
                                (number,)).fetchall() == [(job,)]
        assert listener.conn.execute("SELECT job_id FROM etc_batch.job_progress WHERE job_number = %s",
                                     (number,)).fetchall() == []
    finally:
        close_quietly([listener.conn, as_clerk, admin])
