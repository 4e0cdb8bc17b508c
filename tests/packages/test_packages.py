"""The Debian packages as a DBA installs them, on Debian 12 (PostgreSQL 15) and Debian 13
(PostgreSQL 17).

Each test takes a fresh copy of a Debian root that has nothing but debootstrap's minimal
system and Debian's postgresql-<major> (scripts/debian.sh): no compiler, no Rust, no
cargo-pgrx. There `apt-get install ./postgresql-<major>-etc-batch_<version>_amd64.deb`,
the cluster Debian made at install (<major>/main, listening on its socket only, so that
it takes no port of this machine) started with pg_ctlcluster, and psql run as the
postgres OS user, as a DBA does.

- The smoke scenario: a chain with a failing step that is retried, a job drained over
  two calls and stopped by a conflict, verify_job and the doctor. Then `apt-get remove`
  leaves the cluster's data as it was, and installing the package again makes etc_batch
  usable again.
- The upgrade: the previous release's package (0.4.0, built from its commit), a job half
  drained, the new package installed over it, ALTER EXTENSION etc_batch UPDATE, the job
  finished: every item exactly once.

scripts/test builds the packages first (scripts/package 15, 17, and both for 0.4.0).
"""

import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import ROOT, lib  # noqa: E402

RELEASES = [("bookworm", 15), ("trixie", 17)]
CURRENT = re.search(r'^version = "(.*)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
PREVIOUS = "0.4.0"
PACKAGES = ROOT / "target" / "packages"
DEMO = ROOT / "demo"
FESTIVAL = 40  # the orders of demo/festival_setup.sql's approval, 10 per chunk


def package(major, version):
    deb = PACKAGES / f"postgresql-{major}-etc-batch_{version}_amd64.deb"
    assert deb.exists(), f"{deb} is missing: run scripts/package {major} {version}"
    return deb


class Root:
    """A fresh copy of the Debian root of `release` with only its postgresql-<major>."""

    def __init__(self, release, major, name):
        self.major = major
        made = lib("debian_copy", release, name, timeout=600)
        assert made.returncode == 0, made.stderr
        self.path = Path(made.stdout.strip().splitlines()[-1])
        self.started = False

    def run(self, *command, check=True, timeout=300):
        # as on a machine of its own: nothing of the test clusters' libpq settings
        unset = [a for v in ("PGHOST", "PGPORT", "PGUSER", "PGDATABASE") for a in ("-u", v)]
        done = lib("debian_run", str(self.path), "env", *unset, *command, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def apt_install(self, deb):
        """apt-get install ./the.deb, from a directory of the root, as a DBA would."""
        shutil.copy(deb, self.path / "tmp" / deb.name)
        self.run("sh", "-c", f"cd /tmp && apt-get install -y -q ./{deb.name}")

    def apt_remove(self):
        self.run("apt-get", "remove", "-y", "-q", f"postgresql-{self.major}-etc-batch")

    def start(self):
        """Debian's cluster <major>/main, on its socket only, with etc_batch preloaded as
        the README's Install section says (for launches)."""
        conf = self.path / "etc" / "postgresql" / str(self.major) / "main" / "postgresql.conf"
        with conf.open("a") as f:
            f.write("listen_addresses = ''\nshared_preload_libraries = 'etc_batch'\n")
        self.run("pg_ctlcluster", str(self.major), "main", "start")
        self.started = True

    def restart(self):
        self.run("pg_ctlcluster", str(self.major), "main", "restart")

    def stop(self):
        if self.started:
            self.run("pg_ctlcluster", str(self.major), "main", "stop", "-m", "fast", check=False)
            self.started = False

    def psql(self, sql, db="smoke", check=True):
        """psql as the postgres OS user over the cluster's socket; the rows, | separated."""
        done = self.run("runuser", "-u", "postgres", "--", "psql", "-X", "-A", "-t", "-q",
                        "-v", "ON_ERROR_STOP=1", "-d", db, "-c", sql, check=check)
        return done.stdout.strip()

    def psql_file(self, path, db="smoke"):
        return self.psql(path.read_text(), db=db)

    def remove(self):
        self.stop()
        lib("bash", "-c", f'as_root rm -rf "{self.path}"')


@pytest.fixture
def root(request):
    roots = []

    def make(release, major, name):
        r = Root(release, major, name)
        roots.append(r)
        return r

    yield make
    for r in roots:
        r.stop()


def festival(r, db="smoke"):
    """demo/festival_setup.sql's approval: 40 orders of alien-fest, 10 per chunk."""
    r.psql_file(DEMO / "festival_setup.sql", db=db)
    assert committed(r, db=db) == 0


def committed(r, job="festival-cancel", db="smoke"):
    return int(r.psql(f"SELECT committed FROM etc_batch.job_progress WHERE job_id = '{job}'", db=db))


def audited(r, job="festival-cancel", db="smoke"):
    return Counter(r.psql(f"SELECT item_key FROM etc_batch.job_audit_items WHERE job_id = '{job}'",
                          db=db).split())


@pytest.mark.parametrize("release,major", RELEASES)
def test_package_installs_with_apt_and_runs_chains_and_jobs(root, release, major):
    deb = package(major, CURRENT)
    r = root(release, major, f"smoke-{major}")
    # what the root has: Debian's PostgreSQL, and nothing to build with
    assert r.run("sh", "-c", "command -v cargo rustc gcc cc clang", check=False).stdout == ""
    r.apt_install(deb)
    assert r.run("dpkg-query", "-W", "-f", "${Status} ${Version}", f"postgresql-{major}-etc-batch").stdout \
        == f"install ok installed {CURRENT}"
    r.start()
    r.psql("CREATE DATABASE smoke", db="postgres")
    r.psql("CREATE EXTENSION etc_batch")
    assert r.psql("SELECT extversion FROM pg_extension WHERE extname = 'etc_batch'") == CURRENT
    assert r.psql("SHOW server_version_num")[:2] == str(major)

    # a chain: step 24 fails (no exchange rate yet), is retried after the fix, done once
    r.psql_file(DEMO / "chain_setup.sql")
    r.psql("CALL etc_batch.exec_batch_from_id(21)", check=False)
    assert r.psql("SELECT id, status FROM etc_batch.batch_log ORDER BY id").split() == \
        ["21|done", "22|done", "23|done", "24|failed"]
    r.psql("INSERT INTO df.exchange_rate VALUES (1.08)")
    r.psql("SELECT etc_batch.retry_step(24)")
    r.psql("CALL etc_batch.exec_batch_from_id(21)")
    assert r.psql("SELECT id, status, attempts FROM etc_batch.batch_log ORDER BY id").split() == \
        ["21|done|1", "22|done|1", "23|done|1", "24|done|2"]
    assert r.psql("SELECT count(*) = count(DISTINCT (day, store)) FROM df.daily_sales") == "t"

    # a job drained over two calls; the second stops at a conflict in chunk 4
    festival(r)
    r.psql("CALL etc_batch.drain_job('festival-cancel', 2)")
    assert committed(r) == 20
    r.psql("UPDATE orders SET qty = qty + 1, revision = revision + 1 WHERE tenant = 'alien-fest' AND id = 1231")
    stopped = r.psql("CALL etc_batch.drain_job('festival-cancel')", check=False)
    assert committed(r) == 30
    assert r.psql("SELECT status FROM etc_batch.job WHERE job_id = 'festival-cancel'") == "conflict", stopped
    assert r.psql("SELECT count(*) FROM orders WHERE tenant = 'alien-fest' AND status = 'cancelled'") == "30"
    assert audited(r) == Counter({k: 1 for k in audited(r)}) and sum(audited(r).values()) == 30
    assert r.psql("SELECT bool_and(ok) FROM etc_batch.verify_job('festival-cancel')") == "t"
    doctor = dict(line.split("|", 1) for line in r.psql(
        "SELECT check_name, status FROM etc_batch.doctor()").splitlines())
    # the doctor names the job in conflict, and nothing else fails (the library preloaded)
    assert doctor.pop("job festival-cancel") == "fail", doctor
    assert "fail" not in doctor.values(), doctor
    assert "conflict" in r.psql("SELECT detail FROM etc_batch.doctor() WHERE check_name = 'job festival-cancel'")

    # apt-get remove: the library goes, the cluster's data stays
    before = r.psql("SELECT (SELECT count(*) FROM orders WHERE status = 'cancelled'), "
                    "(SELECT count(*) FROM etc_batch.job_audit), (SELECT count(*) FROM etc_batch.step_audit)")
    r.apt_remove()
    assert not (r.path / f"usr/lib/postgresql/{major}/lib/etc_batch.so").exists()
    assert not list((r.path / f"usr/share/postgresql/{major}/extension").glob("etc_batch*"))
    assert r.psql("SELECT (SELECT count(*) FROM orders WHERE status = 'cancelled'), "
                  "(SELECT count(*) FROM etc_batch.job_audit), (SELECT count(*) FROM etc_batch.step_audit)") == before
    # installed again, after a restart that loads it again: usable as before, the rest of
    # the approval (the drifted order at its state now) approved again and drained
    r.apt_install(deb)
    r.restart()
    assert committed(r) == 30
    r.psql("SELECT * FROM etc_batch.register_remainder('festival-cancel', 'festival-rest', include_drifted => true)")
    r.psql("CALL etc_batch.drain_job('festival-rest')")
    assert r.psql("SELECT status FROM etc_batch.job WHERE job_id = 'festival-rest'") == "done"
    both = audited(r) + audited(r, "festival-rest")
    assert both == Counter({k: 1 for k in both}) and len(both) == FESTIVAL
    assert r.psql("SELECT count(*) FROM orders WHERE tenant = 'alien-fest' AND status = 'cancelled'") == str(FESTIVAL)


@pytest.mark.parametrize("release,major", RELEASES)
def test_package_upgrade_from_previous_release_finishes_job_exactly_once(root, release, major):
    old, new = package(major, PREVIOUS), package(major, CURRENT)
    r = root(release, major, f"upgrade-{major}")
    r.apt_install(old)
    r.start()
    r.psql("CREATE DATABASE smoke", db="postgres")
    r.psql("CREATE EXTENSION etc_batch")
    assert r.psql("SELECT extversion FROM pg_extension WHERE extname = 'etc_batch'") == PREVIOUS
    festival(r)
    r.psql("CALL etc_batch.drain_job('festival-cancel', 2)")
    assert committed(r) == 20

    r.apt_install(new)
    assert r.run("dpkg-query", "-W", "-f", "${Version}", f"postgresql-{major}-etc-batch").stdout == CURRENT
    # the preloaded library is the old one until the server restarts
    r.restart()
    r.psql("ALTER EXTENSION etc_batch UPDATE")
    assert r.psql("SELECT extversion FROM pg_extension WHERE extname = 'etc_batch'") == CURRENT
    r.psql("CALL etc_batch.drain_job('festival-cancel')")
    assert r.psql("SELECT status FROM etc_batch.job WHERE job_id = 'festival-cancel'") == "done"
    assert audited(r) == Counter({k: 1 for k in audited(r)}) and sum(audited(r).values()) == FESTIVAL
    assert r.psql("SELECT count(*) FROM orders WHERE tenant = 'alien-fest' AND status = 'cancelled'") == str(FESTIVAL)
    assert r.psql("SELECT bool_and(ok) FROM etc_batch.verify_job('festival-cancel')") == "t"
