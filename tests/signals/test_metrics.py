"""etc_batch.metrics through Debian's prometheus-postgres-exporter, for real: the exporter
(unpacked from its package by scripts/lib.sh's ensure_exporter) runs on loopback against
this suite's cluster with contrib/prometheus-postgres-exporter.yaml, and is scraped over
HTTP during a paced drain: the series are there, labelled by job, and growing; the scrape
docs/operations.md shows is checked against the last one."""

import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

from support import ROOT, close_quietly, lib, wait_until
from test_signals import Call, make_orders, register

EXPORTER_PORT = 55496
DOCS = ROOT / "docs" / "operations.md"


def start_exporter(cluster):
    done = lib("ensure_exporter", timeout=300)
    assert done.returncode == 0, done.stderr
    program = done.stdout.strip().splitlines()[-1]
    dsn = (f"host={cluster.socket_dir} port={cluster.port} user=postgres "
           f"dbname={cluster.test_db} sslmode=disable")
    log = open(ROOT / "target" / "exporter.log", "w")
    process = subprocess.Popen(
        [program, f"--web.listen-address=127.0.0.1:{EXPORTER_PORT}",
         f"--extend.query-path={ROOT / 'contrib' / 'prometheus-postgres-exporter.yaml'}",
         "--disable-default-metrics", "--disable-settings-metrics"],
        env={**os.environ, "DATA_SOURCE_NAME": dsn}, stdout=log, stderr=subprocess.STDOUT)
    wait_until(lambda: scrape_or_none() is not None, "the exporter to answer")
    return process


def scrape_or_none():
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{EXPORTER_PORT}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def series(text, job):
    """name{labels} -> value, for the samples of etc_batch, those of `job` among them."""
    out = {}
    for line in text.splitlines():
        if line.startswith("etc_batch_") and (f'job_id="{job}"' in line or "job_id" not in line):
            name, value = line.rsplit(" ", 1)
            # the exporter adds the server it read: not etc_batch's label
            out[without_server(name)] = float(value)
    return out


def without_server(name):
    """A series' name and labels without the label the exporter adds, the server it read
    (the cluster's socket directory and port): not etc_batch's."""
    return re.sub(r',?server="[^"]*"', "", name).replace("{,", "{").replace("{}", "")


def documented_scrape():
    """The scrape docs/operations.md shows, after its marker."""
    text = DOCS.read_text()
    at = text.index("<!-- scrape: tests/signals/test_metrics.py -->")
    block = text[at:].split("```", 2)[1]
    return [line for line in block.splitlines() if line.startswith("etc_batch_")]


def test_the_exporter_scrapes_the_metrics_of_a_drain_as_it_goes(signals):
    admin = signals.connect()
    exporter = start_exporter(signals)
    try:
        table = make_orders(admin, 600)
        job = register(admin, table, 600, 20, "metrics")
        # about three seconds of work, and a short wait for a throttle query before it
        admin.execute("CREATE TABLE IF NOT EXISTS meter (closed boolean NOT NULL)")
        admin.execute("TRUNCATE meter; INSERT INTO meter VALUES (true)")
        admin.execute("SELECT etc_batch.pace_job(%s, 200, throttle_query => 'SELECT closed FROM meter')",
                      (job,))
        drain = Call(signals.connect(), "CALL etc_batch.drain_job(%s)", (job,))
        wait_until(lambda: "waiting for its throttle_query" in (admin.execute(
            "SELECT query FROM pg_stat_activity WHERE pid = %s", (drain.pid,)).fetchone()[0] or ""),
            "the drain to wait")
        time.sleep(0.5)
        admin.execute("UPDATE meter SET closed = false")
        key = f'etc_batch_job_items_committed{{job_id="{job}"}}'
        first = wait_until(lambda: (lambda s: s if s.get(key, 0) > 0 else None)(series(scrape_or_none(), job)),
                           "a first chunk in the scrape")
        time.sleep(1.0)
        second = series(scrape_or_none(), job)
        assert second[key] > first[key], (first[key], second[key])
        assert second[f'etc_batch_job_chunks_committed{{job_id="{job}"}}'] > first[
            f'etc_batch_job_chunks_committed{{job_id="{job}"}}']
        assert second[f'etc_batch_job_items_approved{{job_id="{job}"}}'] == 600
        assert second[f'etc_batch_job_status_current{{job_id="{job}",status="pending"}}'] == 1
        assert drain.join()[4] == "done"
        last_text = scrape_or_none()
        last = series(last_text, job)
        assert last[key] == 600 and last[f'etc_batch_job_chunk_seconds_count{{job_id="{job}"}}'] == 30
        assert 0 < last[f'etc_batch_job_chunk_seconds_sum{{job_id="{job}"}}'] < last[
            f'etc_batch_job_seconds_at_work{{job_id="{job}"}}']
        assert last[f'etc_batch_job_status_current{{job_id="{job}",status="done"}}'] == 1
        waited = last[f'etc_batch_job_waited_seconds{{job_id="{job}",waited_for="throttle_query"}}']
        assert waited >= 0.5, waited
        assert last[f'etc_batch_job_waited_waits{{job_id="{job}",waited_for="throttle_query"}}'] == 1
        assert last["etc_batch_workers_running"] == 0
        (ROOT / "target" / "exporter-scrape.txt").write_text(last_text)
        # what docs/operations.md shows is this scrape: every series it names is here, and
        # every number but the seconds is this one
        shown = documented_scrape()
        assert shown, "no scrape in docs/operations.md"
        for line in shown:
            name, value = line.replace("metrics_…", job).rsplit(" ", 1)
            name = without_server(name)
            assert name in last, f"docs/operations.md shows {name}, which the scrape has not"
            if "seconds" not in name:
                assert last[name] == float(value), (name, last[name], value)
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)
        close_quietly([admin])
