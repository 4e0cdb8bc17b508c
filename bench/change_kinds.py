"""Each kind of change against the loop a DBA writes by hand for the same work.

The same table each time: events(id bigint PRIMARY KEY, at timestamptz, status text,
body text), 2 x N rows of which N (every other id) are 'old' and go. For every kind,
at chunks of 100 and 1,000, three drains of the same N rows, back to back in an order
that turns from repetition to repetition:

  etc_batch  register_job_from_query (the old rows, guarded by `expect` on the status,
             no revision column) and drain_job, timed together
  by hand    the competent PL/pgSQL keyset loop, with an audit: per chunk the next keys
             in key order, the change, one audit row per row changed with what it was
             (a deleted row's whole content), COMMIT
  bare       the same loop without the audit

Kinds measured here: delete (the loop: DELETE ... RETURNING into the audit) and move
(the loop as pt-archiver copies then deletes: INSERT INTO the archive SELECT, then the
DELETE, then the audit). A ratio is the median of the repetitions' own (etc_batch's rows
per second over the other's); with it the WAL each writes per row.
"""

import time

from common import connect, lsn, summary, wal_since

CHUNKS = (100, 1000)
KINDS = ("delete", "move")
METHODS = ("etc_batch", "by hand", "bare")

LOOPS = """
CREATE SCHEMA IF NOT EXISTS kinds;
CREATE TABLE IF NOT EXISTS kinds.audit (
    id bigint, row_before text, txid bigint, committed_at timestamptz);

-- by hand: a keyset loop, the next chunk of old rows in key order, deleted (moved:
-- copied to the archive first), each row's content kept in the audit, COMMIT
CREATE OR REPLACE PROCEDURE kinds.purge(p_chunk int, p_move boolean, p_audit boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint := 0;
    v_upto bigint;
BEGIN
    LOOP
        SELECT max(id) INTO v_upto
          FROM (SELECT id FROM public.events WHERE id > v_last AND status = 'old'
                 ORDER BY id LIMIT p_chunk) s;
        EXIT WHEN v_upto IS NULL;
        IF p_move THEN
            INSERT INTO public.events_archive (id, at, status, body)
            SELECT id, at, status, body FROM public.events
             WHERE id > v_last AND id <= v_upto AND status = 'old';
        END IF;
        IF p_audit THEN
            WITH d AS (
                DELETE FROM public.events e WHERE id > v_last AND id <= v_upto AND status = 'old'
                RETURNING e.id, e::text AS row_before)
            INSERT INTO kinds.audit SELECT d.id, d.row_before, txid_current(), now() FROM d;
        ELSE
            DELETE FROM public.events WHERE id > v_last AND id <= v_upto AND status = 'old';
        END IF;
        v_last := v_upto;
        COMMIT;
    END LOOP;
END $$;
"""


def fresh(c, rows):
    c.execute("DROP TABLE IF EXISTS events, events_archive")
    c.execute("CREATE TABLE events (id bigint PRIMARY KEY, at timestamptz NOT NULL, "
              "status text NOT NULL, body text NOT NULL)")
    c.execute("INSERT INTO events SELECT g, timestamptz '2026-01-01' + g * interval '1 second', "
              "CASE WHEN g %% 2 = 0 THEN 'old' ELSE 'new' END, repeat(md5(g::text), 3) "
              "FROM generate_series(1, %s) g", (2 * rows,))
    c.execute("CREATE TABLE events_archive (id bigint, at timestamptz, status text, body text, "
              "archived_at timestamptz NOT NULL DEFAULT now())")
    c.execute("TRUNCATE kinds.audit")
    c.execute("VACUUM ANALYZE events")
    c.execute("CHECKPOINT")


def drain(db, kind, method, chunk, rows):
    """Rows per second and WAL bytes per row of one drain of the old rows."""
    with connect(db) as c:
        fresh(c, rows)
        start = lsn(c)
        t = time.perf_counter()
        if method == "etc_batch":
            job = f"{kind}-{chunk}-{time.monotonic_ns()}"
            c.execute(
                "SELECT etc_batch.register_job_from_query(%s, NULL, 'events', "
                "'SELECT id FROM events WHERE status = ''old''', %s, NULL, '{\"status\": \"old\"}', "
                "tenant_column => NULL, revision_column => NULL, guard => 'columns', "
                "action => %s, archive => %s)",
                (job, chunk, kind, "events_archive" if kind == "move" else None))
            status = c.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4]
            assert status == "done", status
        else:
            c.execute("CALL kinds.purge(%s, %s, %s)", (chunk, kind == "move", method == "by hand"))
        seconds = time.perf_counter() - t
        wal = wal_since(c, start)
        left, archived = c.execute(
            "SELECT (SELECT count(*) FROM events WHERE status = 'old'), "
            "(SELECT count(*) FROM events_archive)").fetchone()
        assert left == 0 and archived == (rows if kind == "move" else 0), (left, archived)
        assert c.execute("SELECT count(*) FROM events").fetchone()[0] == rows
    return rows / seconds, wal / rows


def measure(db, rows, reps):
    with connect(db) as c:
        c.execute(LOOPS)
    out = {"rows": rows, "reps": reps}
    for kind in KINDS:
        out[kind] = {}
        for chunk in CHUNKS:
            rate = {m: [] for m in METHODS}
            wal = {m: [] for m in METHODS}
            for rep in range(reps):
                order = METHODS[rep % 3:] + METHODS[:rep % 3]
                for m in order:
                    r, w = drain(db, kind, m, chunk, rows)
                    rate[m].append(r)
                    wal[m].append(w)
                print(f"kinds {kind} chunk={chunk} rep={rep + 1}: "
                      + ", ".join(f"{m} {rate[m][-1]:,.0f} rows/s" for m in METHODS), flush=True)
            out[kind][str(chunk)] = {
                "rows_per_s": {m: summary(v) for m, v in rate.items()},
                "wal_per_row": {m: summary(v) for m, v in wal.items()},
                "over_by_hand": summary([e / h for e, h in zip(rate["etc_batch"], rate["by hand"])]),
                "over_bare": summary([e / b for e, b in zip(rate["etc_batch"], rate["bare"])]),
            }
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS events, events_archive")
        c.execute("DROP SCHEMA kinds CASCADE")
    return out
