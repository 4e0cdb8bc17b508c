"""A 1,000,000-item job drained one chunk per call (bench/million_job.py): it finishes
with every item audited once, and the draining backend's private memory does not grow
from the first chunk to the last. The times are printed and kept in
target/million_job.json for docs/jobs.md; they are reported, never asserted."""

import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import million_job  # noqa: E402

ITEMS = int(os.environ.get("ETC_BATCH_MILLION_ITEMS", "1000000"))

# Anything a chunk leaked would show up a thousand times over; a few MB of slack cover
# allocator noise.
FLAT_KB = 8 * 1024


def test_million_item_job_drains_with_flat_memory():
    r = million_job.measure(items=ITEMS, chunk=1000)
    (ROOT / "target" / "million_job.json").write_text(json.dumps(r, indent=2))
    print(json.dumps(r, indent=2))
    assert r["final_status"] == "done"
    assert r["final_next_index"] == ITEMS
    assert r["audit_rows"] == ITEMS
    growth = r["rss_anon_kb_after_last_chunk"] - r["rss_anon_kb_after_first_chunk"]
    assert growth < FLAT_KB, f"the draining backend grew by {growth} kB over {r['chunks']} chunks"
