"""A job too large for a jsonb approval (about 3.5 million items fit one), registered
from a query and drained to the end by one call (bench/big_job.py): every item changed
and audited exactly once, the registering and the draining backend's private memory
flat, a bounded result, and the finished job pruned by dropping its partitions. Then
register_job with a jsonb list of a million items hands its memory back. The numbers
of the last run are kept in target/big_job.json; times are reported, never asserted."""

import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import big_job  # noqa: E402

ITEMS = int(os.environ.get("ETC_BATCH_SCALE_ITEMS", "4000000"))
JSONB_ITEMS = int(os.environ.get("ETC_BATCH_SCALE_JSONB_ITEMS", "1000000"))
CHUNK = 1000

# "A few tens of MB" over the backend's size before the call, whatever the job's size:
# a registration that held its items would take gigabytes.
REGISTER_MB = 48
# Anything a chunk kept would show up thousands of times over.
DRAIN_MB = 16
# What a jsonb registration may leave behind once it returns.
KEPT_MB = 16


def test_a_job_larger_than_any_jsonb_approval():
    r = big_job.measure(items=ITEMS, chunk=CHUNK, jsonb_items=JSONB_ITEMS)
    (ROOT / "target" / "big_job.json").write_text(json.dumps(r, indent=2))
    print(json.dumps(r, indent=2))
    chunks = (ITEMS + CHUNK - 1) // CHUNK

    assert r["registered"] == ["big", True, ITEMS, chunks]
    memory = r["register_rss_mb"]
    assert memory["peak"] - memory["before"] < REGISTER_MB, memory

    # one call to the end: counts and the first and last key, never the keys
    assert r["drain_result"] == [chunks, ITEMS, "1", str(ITEMS), "done"]
    memory = r["drain_rss_mb"]
    assert memory["peak"] - memory["before"] < DRAIN_MB, memory

    # exactly once, on the business table and in the audit
    assert (r["audit_rows"], r["audited_positions"]) == (ITEMS, ITEMS)
    assert (r["orders_changed_once"], r["orders_of_b_changed"]) == (ITEMS, 0)

    # pruned whole: the job's row and its two partitions, with no row-by-row DELETE
    assert r["pruned"] == [0, 1, 0] and r["tables_left"] == 0
    assert r["prune_wal_bytes"] < 1024 * 1024, r["prune_wal_bytes"]

    jsonb = r["jsonb"]
    assert jsonb["registered"] == ["from-jsonb", True, JSONB_ITEMS, (JSONB_ITEMS + CHUNK - 1) // CHUNK]
    assert jsonb["rss_mb"]["after"] - jsonb["rss_mb"]["before"] < KEPT_MB, jsonb
