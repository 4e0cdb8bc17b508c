"""Progress at a human rate, as a DBA's psql session receives it.

With etc_batch.progress_interval at its default (1 s; the test clusters run at 0, so
each test sets it in its own session), a drain of slow chunks and a chain of slow
steps tell where they stand at most once a second (chunks or steps, the rate, the time
to go) and once at the end how the call ended; at 0 they tell every chunk and step
instead. The deterministic form of the same (an interval no call reaches) is
tests/pg_regress/sql/progress.sql.
"""

import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHUNKS = 30
# each chunk's change sleeps this long (a statement trigger), so that a drain lasts
# about CHUNKS * SLOW seconds, long enough for a few progress notices
SLOW = 0.1


def tag(label):
    return f"{label}_{secrets.token_hex(3)}"


def psql(direct, script, tmp_path):
    """Runs `script` in one psql session; its notices (stderr) line by line, and how
    long the session took in seconds."""
    path = tmp_path / "progress.sql"
    path.write_text(script)
    started = time.monotonic()
    done = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", *direct.psql_args(), "-U", "postgres",
         "-f", str(path)],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PGCONNECT_TIMEOUT": "10"})
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    notices = [line.split("NOTICE:  ", 1)[1] for line in done.stderr.splitlines()
               if "NOTICE:  " in line]
    return notices, took


def slow_job(pg, label):
    """A job of CHUNKS chunks of 100 items whose every chunk takes SLOW seconds."""
    name = tag(label)
    t = sql.Identifier(name)
    slow = sql.Identifier(f"{name}_slow")
    pg.admin.execute(sql.SQL(
        "CREATE TABLE {} (id int PRIMARY KEY, st text NOT NULL DEFAULT 'new')").format(t))
    pg.admin.execute(sql.SQL(
        "INSERT INTO {} (id) SELECT g FROM generate_series(1, %s) g").format(t), (CHUNKS * 100,))
    pg.admin.execute(sql.SQL(
        "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep({}); RETURN NULL; END $$").format(slow, sql.Literal(SLOW)))
    pg.admin.execute(sql.SQL(
        "CREATE TRIGGER slow AFTER UPDATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}()"
    ).format(t, slow))
    pg.admin.execute(
        "SELECT etc_batch.register_job_from_query(%s, NULL, %s::regclass, "
        "format('SELECT id FROM %%I', %s::text), 100, '{\"st\": \"done\"}', "
        "tenant_column => NULL, revision_column => NULL)", (name, name, name))
    return name


PROGRESS = re.compile(
    r'job "(?P<job>[^"]+)": chunk (?P<chunk>\d+) of (?P<total>\d+) committed; this call: '
    r'(?P<chunks>\d+) chunks?, (?P<items>\d+) items?, (?P<rate>\d+) items/s'
    r'(, about (?P<to_go>[0-9]+ (ms|s|min [0-9]+ s)) to go)?$')


def test_a_drain_tells_where_it_stands_at_most_once_a_second(direct, pg, tmp_path):
    job = slow_job(pg, "progress")
    notices, took = psql(direct, f"""
SET etc_batch.progress_interval = '1s';
CALL etc_batch.drain_job('{job}');
""", tmp_path)
    *progress, end = notices
    assert end == f'job "{job}": this call committed {CHUNKS} chunks, {CHUNKS * 100} items, ' \
                  f'keys 1 to {CHUNKS * 100}; the job is done', notices
    # at most one a second, and the call lasted long enough for at least two
    assert took >= CHUNKS * SLOW
    assert 2 <= len(progress) <= took, (took, notices)
    seen = [PROGRESS.match(n) for n in progress]
    assert all(seen), notices
    chunks = [int(m["chunk"]) for m in seen]
    assert chunks == sorted(chunks) and len(set(chunks)) == len(chunks), chunks
    for m in seen:
        assert m["job"] == job and int(m["total"]) == CHUNKS
        # one drainer, in order: the chunks of this call are the chunks so far
        assert int(m["chunks"]) == int(m["chunk"]) and int(m["items"]) == 100 * int(m["chunk"])
        # no chunk is quicker than SLOW: at most 100 items per SLOW seconds
        assert 0 < int(m["rate"]) <= 100 / SLOW * 1.05, m.group(0)
        assert m["to_go"] is not None, m.group(0)
    # a second apart: at least a second's worth of chunks between two notices
    assert all(b - a >= 1 / SLOW * 0.9 for a, b in zip(chunks, chunks[1:])), chunks

    # at 0, every chunk as it commits, and no summary
    job = slow_job(pg, "each")
    notices, _ = psql(direct, f"""
SET etc_batch.progress_interval = 0;
CALL etc_batch.drain_job('{job}', 5);
""", tmp_path)
    assert notices == [f"chunk {c} of {CHUNKS} committed: 100 items, keys {c * 100 - 99} to {c * 100}"
                       for c in range(1, 6)], notices


CHAIN_PROGRESS = re.compile(
    r'batch "(?P<batch>[^"]+)": step (?P<step>\d+) committed; this call: (?P<ran>\d+) steps?'
    r' committed, (?P<skipped>\d+) skipped as done, (?P<rate>\d+) steps/s$')


def test_a_chain_tells_where_it_stands_at_most_once_a_second(direct, pg, tmp_path):
    batch = tag("progress_chain")
    steps = 30
    first = pg.admin.execute(
        "SELECT min(etc_batch.add_step(%s, %s)) FROM generate_series(1, %s)",
        (batch, f"SELECT pg_sleep({SLOW})", steps)).fetchone()[0]
    notices, took = psql(direct, f"""
SET etc_batch.progress_interval = '1s';
CALL etc_batch.exec_batch_from_id({first});
""", tmp_path)
    *progress, end = notices
    assert end == (f'batch "{batch}": this call committed {steps} steps; '
                   "it ran to the batch's last step"), notices
    assert 2 <= len(progress) <= took, (took, notices)
    seen = [CHAIN_PROGRESS.match(n) for n in progress]
    assert all(seen), notices
    for m in seen:
        assert m["batch"] == batch and m["skipped"] == "0"
        assert int(m["step"]) == first + int(m["ran"]) - 1
        assert 0 < int(m["rate"]) <= 1 / SLOW * 1.05, m.group(0)
    ran = [int(m["ran"]) for m in seen]
    assert all(b - a >= 1 / SLOW * 0.9 for a, b in zip(ran, ran[1:])), ran

    # again: every step is done, so skipped, and said so once
    notices, _ = psql(direct, f"""
SET etc_batch.progress_interval = '1s';
CALL etc_batch.exec_batch_from_id({first});
""", tmp_path)
    assert notices == [f'batch "{batch}": this call committed nothing, skipped {steps} steps '
                       "already done; it ran to the batch's last step"], notices
