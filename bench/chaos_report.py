"""The report of a chaos run (tests/faults/test_chaos.py) as markdown: its seed, how long
it ran, what struck, what the callers saw, and how every job ended once the invariants
held. `bench/run chaos MINUTES` writes bench/results/chaos/latest.{json,md} with it.

    python bench/chaos_report.py bench/results/chaos/latest.json > bench/results/chaos/latest.md
"""

import json
import os
import sys
import time

from common import commit, machine


def measured(report_path):
    """When (the report's time), on what machine, at what commit."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(report_path)))
    return (f"Measured {when} on {machine()}; PostgreSQL 15; "
            f"commit {commit('src', 'sql', 'tests/faults')}.")


def table(title, counts, what):
    rows = sorted(counts.items(), key=lambda kv: -kv[1])
    return [f"| {title} | {what} |", "|---|---:|"] + [f"| {k} | {v:,} |" for k, v in rows] + [""]


def render(r, when):
    lines = [
        when,
        "",
        f"{r['seconds'] / 60:.1f} minutes of work and faults, {r['rounds']} rounds of jobs and chains, "
        f"seed {r['seed']} "
        f"(`ETC_BATCH_CHAOS_SEED={r['seed']}` runs the same schedule again). "
        f"Invariants: **{r['invariants']}**.",
        "",
    ]
    lines += table("fault", r["faults"], "times")
    lines += table("call", r["calls"], "calls")
    lines += table("the DBA's action", r["actions"], "times")
    lines += table("error a caller saw (SQLSTATE)", r["errors seen by callers"], "times")
    lines += ["| job | table | parallel | on_drift | chunk | ended |", "|---|---|---|---|---:|---|"]
    for name, j in sorted(r["jobs"].items()):
        lines.append(f"| {name} | {j['table']} | {'yes' if j['parallel'] else 'no'} | {j['on_drift']} "
                     f"| {j['chunk']} | {j['ended']} |")
    lines += ["", "A job ends in conflict when an item it approved was changed by the application "
              "and the job stops on drift; it is checked as every other job is, up to that item.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(render(json.load(f), measured(sys.argv[1])), end="")
