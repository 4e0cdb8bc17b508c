"""A client whose network goes away silently in the middle of a drain or of a chain's
run: the link to its host taken down, so that nothing it sent before arrives late and no
reset ever comes. The server runs in a network namespace of its own and the clients are
psql on other hosts (namespaces), as a DBA's scheduler or orchestrator would be.

With the settings docs/faults.md recommends (tcp_user_timeout, TCP keepalives,
client_connection_check_interval) the server gives up on the client within a bound
those settings make, the chunk or step in flight rolls back, and another drainer or
runner finishes the work, every item and step exactly once, nothing held afterwards.
Without them, a backend whose client stopped reading waits to write to it for as long as
TCP retries (some 15 minutes); doctor() names it, what it holds, and what to do.
"""

import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import BOUNCER_PORT, SERVER_NS, pgbouncer
from support import wait_until
from work import changes, held_by_etc_batch, job_state, make_accounts, register, verify

ITEMS = 3000
CHUNK = 2
# the settings under test, short so that the test is; docs/faults.md gives values
# for production and the bound they make
RECOMMENDED = (("tcp_user_timeout", "2000"), ("tcp_keepalives_idle", "1"), ("tcp_keepalives_interval", "1"),
               ("tcp_keepalives_count", "2"), ("client_connection_check_interval", "500"))
# max(tcp_user_timeout, idle + interval x count) + client_connection_check_interval,
# with room for a slow machine
BOUND = 12.0
QUIET = (("client_min_messages", "warning"),)
COMMITTED_NOTICE = re.compile(r"NOTICE:  chunk (\d+) of \d+ committed: (\d+) items, keys (\d+) to (\d+)")


def notices_were_true(conn, output):
    """Every chunk the client was told of is committed, each of its rows changed once."""
    told = [tuple(int(g) for g in m.groups()) for m in COMMITTED_NOTICE.finditer(output)]
    for _, items, first, last in told:
        counts = conn.execute(
            "SELECT count(DISTINCT id), count(*) FROM accounts_log WHERE id BETWEEN %s AND %s",
            (first, last)).fetchone()
        assert counts == (items, items), (first, last, counts)
    return len(told)


def start_chain(conn, noisy):
    """Chain `nightly`: a quick step, a long one (ten seconds; with a NOTICE every 5 ms
    when `noisy`), a quick one; each records that it ran in `ran`, and in which backend."""
    conn.execute("CREATE TABLE ran (step int NOT NULL, pid int NOT NULL DEFAULT pg_backend_pid())")
    say = "RAISE NOTICE 'step 2 at %', i;" if noisy else ""
    commands = [
        "INSERT INTO ran (step) VALUES (1)",
        "DO $$ BEGIN INSERT INTO ran (step) VALUES (2); FOR i IN 1..2000 LOOP " + say
        + " PERFORM pg_sleep(0.005); END LOOP; END $$",
        "INSERT INTO ran (step) VALUES (3)",
    ]
    return [conn.execute("SELECT etc_batch.add_step('nightly', %s)", (c,)).fetchone()[0] for c in commands]


def ran(conn):
    return conn.execute("SELECT step, count(*) FROM ran GROUP BY step ORDER BY step").fetchall()


def in_background(work):
    """Runs work() in a thread; the returned dict gets its result or its error."""
    outcome = {}

    def run():
        try:
            outcome["result"] = work()
        except Exception as e:  # the test asserts on it
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def gone_within(db, pid, bound):
    """Waits for backend `pid` to end; returns how long it took."""
    start = time.monotonic()
    with db.connect() as conn:
        wait_until(lambda: conn.execute("SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)",
                                        (pid,)).fetchone()[0], f"backend {pid} to end", timeout=bound)
    return time.monotonic() - start


@pytest.mark.parametrize("quiet", [False, True], ids=["notices", "quiet"])
def test_a_drain_whose_client_is_cut_off_with_the_recommended_settings(net_db, tmp_path, quiet):
    """A paced sequential drain; its client's link cut after a tenth of the job. Another
    drainer starts at once and goes on between the stranded one's chunks; the stranded
    backend ends within the bound (with notices: its writes go unacknowledged for
    tcp_user_timeout; quiet: the keepalives go unanswered), and the job finishes with
    every item exactly once, every chunk the client was told of committed."""
    conn = net_db.connect()
    make_accounts(conn, ITEMS)
    register(conn, "cut", ITEMS, CHUNK)
    conn.execute("SELECT etc_batch.pace_job('cut', 300)")
    output = tmp_path / "psql.out"
    with open(output, "w") as out:
        client = net_db.psql("client", "CALL etc_batch.drain_job('cut')", out,
                             RECOMMENDED + (QUIET if quiet else ()))
    try:
        wait_until(lambda: job_state(conn, "cut")[1] >= ITEMS // 10, "a tenth of the job")
        (stranded,) = net_db.backends_of("client")
        net_db.link("client").cut()
        cut_at = time.monotonic()
        other = in_background(lambda: net_db.connect().execute("CALL etc_batch.drain_job('cut')").fetchone())
        took = gone_within(net_db, stranded, BOUND)
        print(f"stranded backend ended {took:.1f} s after the cut")
        other["thread"].join(timeout=60)
        assert "error" not in other, other.get("error")
        assert other["result"][-1] == "done"
        assert time.monotonic() - cut_at < 60
    finally:
        client.kill()
        client.wait()
    assert job_state(conn, "cut") == ("done", ITEMS)
    assert changes(conn) == {1: ITEMS}
    verify(conn, "cut")
    told = notices_were_true(conn, output.read_text())
    assert (told == 0) if quiet else (told > 0)
    assert held_by_etc_batch(conn) == []


# PgBouncer's own settings for its clients' connections: the same TCP limits
BOUNCER_RECOMMENDED = ("tcp_keepalive = 1", "tcp_keepidle = 1", "tcp_keepintvl = 1", "tcp_keepcnt = 2",
                       "tcp_user_timeout = 2000")


@pytest.mark.parametrize("quiet", [False, True], ids=["notices", "quiet"])
def test_a_drain_through_pgbouncer_whose_client_is_cut_off(net_db, tmp_path, quiet):
    """PgBouncer on the database's host, in transaction mode, between the client and the
    server; the client's link to it cut. With its TCP settings PgBouncer gives up on the
    client and closes the server connection it had lent it; the backend, told by
    client_connection_check_interval or by its next write, ends; another drainer
    finishes the job, every item once."""
    conn = net_db.connect()
    make_accounts(conn, ITEMS)
    register(conn, "pooled", ITEMS, CHUNK)
    conn.execute("SELECT etc_batch.pace_job('pooled', 300)")
    # a pooler passes no startup options on: the server's settings are the role's or
    # the database's
    conn.execute(f"ALTER DATABASE {net_db.name} SET client_connection_check_interval = '500ms'")
    if quiet:
        conn.execute(f"ALTER DATABASE {net_db.name} SET client_min_messages = warning")
    link = net_db.link("client")
    output = tmp_path / "psql.out"
    with pgbouncer(net_db.cluster, SERVER_NS, link.server_addr, BOUNCER_RECOMMENDED):
        with open(output, "w") as out:
            client = net_db.psql("client", "CALL etc_batch.drain_job('pooled')", out, port=BOUNCER_PORT)
        try:
            wait_until(lambda: job_state(conn, "pooled")[1] >= ITEMS // 10, "a tenth of the job")
            (stranded,) = conn.execute(
                "SELECT drainer_pids FROM etc_batch.job_progress WHERE job_id = 'pooled'").fetchone()[0]
            link.cut()
            other = in_background(lambda: net_db.connect().execute("CALL etc_batch.drain_job('pooled')").fetchone())
            took = gone_within(net_db, stranded, BOUND)
            print(f"stranded backend behind PgBouncer ended {took:.1f} s after the cut")
            other["thread"].join(timeout=60)
            assert "error" not in other, other.get("error")
            assert other["result"][-1] == "done"
        finally:
            client.kill()
            client.wait()
    assert job_state(conn, "pooled") == ("done", ITEMS)
    assert changes(conn) == {1: ITEMS}
    verify(conn, "pooled")
    told = notices_were_true(conn, output.read_text())
    assert (told == 0) if quiet else (told > 0)
    assert held_by_etc_batch(conn) == []


@pytest.mark.parametrize("quiet", [False, True], ids=["notices", "quiet"])
def test_a_chain_whose_runner_is_cut_off_with_the_recommended_settings(net_db, tmp_path, quiet):
    """A chain's long step running when its runner's link is cut: a second runner waits
    for the step's row; the stranded backend ends within the bound, its step rolls back,
    and the second runner runs it and the rest, every step once."""
    conn = net_db.connect()
    ids = start_chain(conn, noisy=not quiet)
    with open(tmp_path / "psql.out", "w") as out:
        client = net_db.psql("client", f"CALL etc_batch.exec_batch_from_id({ids[0]})", out,
                             RECOMMENDED + (QUIET if quiet else ()))
    try:
        wait_until(lambda: ran(conn) == [(1, 1)] and net_db.backends_of("client"), "the chain at its long step")
        (stranded,) = net_db.backends_of("client")
        time.sleep(0.5)
        net_db.link("client").cut()

        def run_again():
            with net_db.connect() as second:
                second.execute(f"CALL etc_batch.exec_batch_from_id({ids[0]})")
                return second.info.backend_pid

        other = in_background(run_again)
        took = gone_within(net_db, stranded, BOUND)
        print(f"stranded backend ended {took:.1f} s after the cut")
        other["thread"].join(timeout=60)
        assert "error" not in other, other.get("error")
    finally:
        client.kill()
        client.wait()
    assert ran(conn) == [(1, 1), (2, 1), (3, 1)]
    # step 1 was the stranded backend's; the step it was in when cut off, and the one
    # after, the second runner's, as the step's own rows and the audit of its runs say
    second = other["result"]
    assert second != stranded
    by = [(ids[step - 1], pid) for step, pid in conn.execute("SELECT step, pid FROM ran ORDER BY step")]
    assert by == [(ids[0], stranded), (ids[1], second), (ids[2], second)], (by, stranded, second)
    audited = conn.execute("SELECT step_id, pid FROM etc_batch.step_audit WHERE outcome = 'done' "
                           "ORDER BY step_id").fetchall()
    assert audited == by, audited
    statuses = conn.execute("SELECT status, attempts FROM etc_batch.batch_log ORDER BY id").fetchall()
    # the attempt the cut ended rolled back whole, its count with it
    assert statuses == [("done", 1), ("done", 1), ("done", 1)]
    assert held_by_etc_batch(conn) == []


def shown_by_psql(net_db, pids):
    """The doctor's rows on the two backends as psql shows them (docs/faults.md quotes
    the expected file): the drainer's first; its pids and times as <pid> and <time>, and
    each record's rule, as wide as the longest line, cut short."""
    shown = subprocess.run(
        [str(net_db.cluster.bin_dir / "psql"), "-X", "-x", "-h", str(net_db.cluster.socket_dir),
         "-p", str(net_db.cluster.port), "-U", "postgres", "-d", net_db.name, "-c",
         "SELECT * FROM etc_batch.doctor() WHERE check_name = 'clients not reading' "
         f"ORDER BY array_position(ARRAY[{pids[0]}, {pids[1]}], split_part(detail, ' ', 2)::int)"],
        capture_output=True, text=True, timeout=60, check=True).stdout
    shown = re.sub(r"(?m)^(-\[ RECORD \d+ \])-+$", r"\1---", shown)
    # the times first, and the pids as whole numbers: a pid may be a time's digits too
    shown = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\+00", "<time>", shown)
    return re.sub(rf"\b({pids[0]}|{pids[1]})\b", "<pid>", shown)


def test_a_client_cut_off_without_the_settings_is_named_by_the_doctor(net_db, tmp_path):
    """No settings: a drainer and a chain's runner, both telling their clients of every
    chunk and step, lose their links. Each backend soon waits to write (ClientWrite) and
    would for as long as TCP retries. doctor() names both: the drainer between chunks
    (another drainer finishes the job meanwhile) and the runner holding its step's row.
    Terminated as its hint says, they let go of everything, and the chain finishes,
    every step once."""
    conn = net_db.connect()
    make_accounts(conn, ITEMS)
    register(conn, "stuck", ITEMS, CHUNK)
    conn.execute("SELECT etc_batch.pace_job('stuck', 300)")
    ids = start_chain(conn, noisy=True)
    with open(tmp_path / "drain.out", "w") as out:
        drainer = net_db.psql("client", "CALL etc_batch.drain_job('stuck')", out)
    with open(tmp_path / "chain.out", "w") as out:
        runner = net_db.psql("client2", f"CALL etc_batch.exec_batch_from_id({ids[0]})", out)
    try:
        wait_until(lambda: job_state(conn, "stuck")[1] >= 100 and ran(conn) == [(1, 1)]
                   and net_db.backends_of("client2"), "both at work")
        (drain_pid,) = net_db.backends_of("client")
        (chain_pid,) = net_db.backends_of("client2")
        net_db.link("client").cut()
        net_db.link("client2").cut()

        def writing():
            return {r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'ClientWrite'")} == {drain_pid, chain_pid}

        wait_until(writing, "both backends waiting to write to their clients")
        found = {detail.split()[1]: (status, detail, hint) for name, status, detail, hint in conn.execute(
            "SELECT * FROM etc_batch.doctor() WHERE check_name = 'clients not reading'")}
        assert set(found) == {str(drain_pid), str(chain_pid)}, found
        status, detail, hint = found[str(drain_pid)]
        assert status == "warn"
        assert "counted as a drainer of job 'stuck' between chunks" in detail
        assert f"SELECT pg_terminate_backend({drain_pid})" in hint
        status, detail, hint = found[str(chain_pid)]
        assert status == "warn"
        assert f"holding the row of step {ids[1]} of chain 'nightly'" in detail
        assert "every other runner of the chain waits for it" in detail
        assert f"SELECT pg_terminate_backend({chain_pid})" in hint
        assert shown_by_psql(net_db, (drain_pid, chain_pid)) == (
            Path(__file__).parent / "expected" / "clients_not_reading.out").read_text()

        # the job goes on without the stranded drainer; the chain cannot
        assert conn.execute("CALL etc_batch.drain_job('stuck')").fetchone()[-1] == "done"
        assert ran(conn) == [(1, 1)]
        # what the hint says
        for pid in (drain_pid, chain_pid):
            conn.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        conn.execute(f"CALL etc_batch.exec_batch_from_id({ids[0]})")
    finally:
        for p in (drainer, runner):
            p.kill()
            p.wait()
    assert job_state(conn, "stuck") == ("done", ITEMS)
    assert changes(conn) == {1: ITEMS}
    verify(conn, "stuck")
    assert ran(conn) == [(1, 1), (2, 1), (3, 1)]
    assert held_by_etc_batch(conn) == []
    assert conn.execute("SELECT status FROM etc_batch.doctor() WHERE check_name = 'clients not reading'"
                        ).fetchall() == [("ok",)]
