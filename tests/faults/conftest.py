"""Faults a DBA meets, staged for real: a disk that fills (a small tmpfs holding a
tablespace) and, in the tests of the network, links cut between network namespaces the
tests make themselves.

  faults    cluster `faults` on port 55510, started with scripts/lib.sh and stopped at the
            end of the module, whatever happened; each test makes databases of its own
  small     a tmpfs mounted under target/faults for the test, with a tablespace on it
            and a ballast file that leaves only `room` bytes free; unmounted after the
            test. Removing the ballast is "freeing space".

These tests mount filesystems and make network namespaces: they run as root.
"""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import ROOT, OwnCluster, lib, own_cluster, pg_bin, wait_until  # noqa: E402

PORT = 55510
TEST_DB = "etc_batch_faults"
HOME = ROOT / "target" / "faults"


@pytest.fixture(scope="module")
def faults():
    if os.geteuid() != 0:
        pytest.fail("tests/faults mount filesystems and make network namespaces: run them as root",
                    pytrace=False)
    HOME.mkdir(parents=True, exist_ok=True)
    with own_cluster("faults", PORT, TEST_DB) as cluster:
        yield cluster


class SmallDisk:
    """A tmpfs of `size` bytes at `path`, a directory on it for a tablespace, owned by
    the server's OS user, and a ballast file that `fill` grows until `room` bytes are
    left."""

    def __init__(self, path, size):
        self.path = path
        self.ballast = path / "ballast"
        self.tablespace_dir = path / "ts"
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        self.tablespace_dir.mkdir()
        subprocess.run(["chown", "postgres:postgres", str(self.tablespace_dir)], check=True)

    def free(self):
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, room):
        """Grows the ballast until no more than `room` bytes are free."""
        with open(self.ballast, "ab") as f:
            os.posix_fallocate(f.fileno(), 0, os.path.getsize(self.ballast) + self.free() - room)
        assert self.free() <= room

    def make_room(self):
        """Frees the space the ballast took: what a DBA does when the disk is full."""
        self.ballast.unlink()

    def unmount(self):
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def small(request):
    path = HOME / ("small-" + "".join(c if c.isalnum() else "-" for c in request.node.name[:40]))
    disk = SmallDisk(path, 4 * 1024 * 1024)
    try:
        yield disk
    finally:
        disk.unmount()


class DiskDb:
    """A database of its own with etc_batch installed and a tablespace `small` on the
    test's small disk."""

    def __init__(self, cluster, name, disk):
        self.cluster = cluster
        self.name = name
        self.disk = disk

    def connect(self, **kwargs):
        return self.cluster.connect(self.name, **kwargs)


@pytest.fixture
def disk_db(faults, small, request):
    name = "disk_" + str(abs(hash(request.node.name)) % 10**8)
    with faults.connect("postgres") as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    db = DiskDb(faults, name, small)
    with db.connect() as conn:
        conn.execute("CREATE EXTENSION etc_batch")
    with faults.connect("postgres") as conn:
        conn.execute(f"CREATE TABLESPACE {name} LOCATION '{small.tablespace_dir}'")
    db.tablespace = name
    try:
        yield db
    finally:
        with faults.connect("postgres") as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"DROP TABLESPACE IF EXISTS {name}")


# -- network namespaces --------------------------------------------------------------------
#
# The server of the network tests runs in a namespace of its own, `etcb-srv`; each host
# it talks to (a client, a standby) in another, joined to it by a veth pair with a /30 of
# 10.213.0.0/16 on it. Nothing of the machine's own network is touched: the addresses
# exist only inside these namespaces, and they are deleted at the end. The tests reach
# the server from outside through its Unix socket, which no link cut can reach.

SERVER_NS = "etcb-srv"
NET_PORT = 55511


def ip(*args, ns=None):
    prefix = ["ip", "netns", "exec", ns] if ns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True)


def in_ns(ns, *command):
    return ["ip", "netns", "exec", ns, *command]


class Link:
    """A veth pair between the server's namespace and host `ns`: the server at
    10.213.<n>.1, the host at 10.213.<n>.2. `cut` takes the host's end down: the server
    sends into it and nothing arrives, nothing comes back, and no reset is sent, as
    when a cable is pulled or a host vanishes. `mend` brings it back."""

    def __init__(self, ns, n):
        self.ns = ns
        self.server_addr = f"10.213.{n}.1"
        self.addr = f"10.213.{n}.2"
        self.server_end = f"etcb{n}s"
        self.end = f"etcb{n}h"
        subprocess.run(["ip", "netns", "add", ns], check=True)
        ip("link", "set", "lo", "up", ns=ns)
        ip("link", "add", self.server_end, "netns", SERVER_NS, "type", "veth", "peer", "name", self.end,
           "netns", ns)
        ip("addr", "add", f"{self.server_addr}/30", "dev", self.server_end, ns=SERVER_NS)
        ip("addr", "add", f"{self.addr}/30", "dev", self.end, ns=ns)
        ip("link", "set", self.server_end, "up", ns=SERVER_NS)
        ip("link", "set", self.end, "up", ns=ns)

    def cut(self):
        ip("link", "set", self.end, "down", ns=self.ns)

    def mend(self):
        ip("link", "set", self.end, "up", ns=self.ns)

    def run(self, *command, **kwargs):
        """A process on this host."""
        return subprocess.Popen(in_ns(self.ns, *command), **kwargs)

    def delete(self):
        subprocess.run(["ip", "netns", "del", self.ns], check=False)


class NetCluster(OwnCluster):
    """The server in namespace etcb-srv, listening on the links' server addresses."""

    links = {}

    def link(self, name):
        return self.links[name]


HOSTS = {"client": ("etcb-cli", 1), "client2": ("etcb-cli2", 2), "standby": ("etcb-sby", 3)}
STANDBY = "faultsby"
STANDBY_PORT = 55512


def pg_ctl_in(ns, data_dir, log, *args):
    return subprocess.run(in_ns(ns, "runuser", "-u", "postgres", "--", str(pg_bin() / "pg_ctl"),
                                "-D", str(data_dir), "-l", str(log), *args),
                          check=True, capture_output=True, text=True)


@contextlib.contextmanager
def server_in_namespace(settings=()):
    """Cluster `faultnet` on port 55511 started inside etcb-srv, whose kernel there keeps
    a small send buffer per socket (net.ipv4.tcp_wmem of that namespace only), so that a
    backend whose client stopped reading soon waits to write; links to the hosts of
    HOSTS, any of which may connect, for replication too."""
    if os.geteuid() != 0:
        pytest.fail("tests/faults make network namespaces: run them as root", pytrace=False)
    for ns in [SERVER_NS] + [ns for ns, _ in HOSTS.values()]:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
    subprocess.run(["ip", "netns", "add", SERVER_NS], check=True)
    links = {}
    try:
        ip("link", "set", "lo", "up", ns=SERVER_NS)
        subprocess.run(in_ns(SERVER_NS, "sysctl", "-q", "-w", "net.ipv4.tcp_wmem=4096 8192 8192"), check=True)
        for name, (ns, n) in HOSTS.items():
            links[name] = Link(ns, n)
        listen = ",".join(["127.0.0.1"] + [l.server_addr for l in links.values()])
        done = lib("cluster_init", "faultnet", str(NET_PORT), f"listen_addresses = '{listen}'", *settings)
        assert done.returncode == 0, done.stderr
        cluster = NetCluster("faultnet", NET_PORT, TEST_DB)
        with open(cluster.data_dir / "pg_hba.conf", "a") as hba:
            hba.write("host all all 10.213.0.0/16 trust\nhost replication all 10.213.0.0/16 trust\n")
        pg_ctl_in(SERVER_NS, cluster.data_dir, cluster.socket_dir / "server.log", "-w", "start")
        with cluster.connect("postgres") as conn:
            conn.execute(f"CREATE DATABASE {TEST_DB}")
        with cluster.connect() as conn:
            conn.execute("CREATE EXTENSION etc_batch")
        cluster.links = links
        cluster.bin_dir = pg_bin()
        yield cluster
    finally:
        lib("cluster_stop", STANDBY)
        lib("cluster_stop", "faultnet")
        for link in links.values():
            link.delete()
        subprocess.run(["ip", "netns", "del", SERVER_NS], check=False)


@pytest.fixture(scope="module")
def net():
    with server_in_namespace() as cluster:
        yield cluster


def start_standby(cluster):
    """A streaming standby of `cluster` on host `standby` (etcb-sby), connected over its
    link: pg_basebackup -R from there, then started there; its Unix socket in
    target/pg/faultsby. Returns it as an OwnCluster."""
    link = cluster.link("standby")
    standby = OwnCluster(STANDBY, STANDBY_PORT, cluster.test_db)
    done = lib("empty_cluster_dir", STANDBY)
    assert done.returncode == 0, done.stderr
    subprocess.run(in_ns(link.ns, "runuser", "-u", "postgres", "--", str(pg_bin() / "pg_basebackup"),
                         "-h", link.server_addr, "-p", str(cluster.port), "-U", "postgres",
                         "-D", str(standby.data_dir), "-R", "-X", "stream", "-c", "fast"),
                   check=True, capture_output=True)
    with open(standby.data_dir / "postgresql.conf", "a") as conf:
        conf.write(f"port = {STANDBY_PORT}\nunix_socket_directories = '{standby.socket_dir}'\n"
                   f"cluster_name = '{STANDBY}'\nlisten_addresses = '{link.addr}'\n")
    pg_ctl_in(link.ns, standby.data_dir, standby.socket_dir / "server.log", "-w", "start")
    return standby


class NetDb:
    """A database of its own on the server in etcb-srv: `connect` through the Unix socket
    (never cut), `psql` on a client host over its link."""

    def __init__(self, cluster, name):
        self.cluster = cluster
        self.name = name

    def connect(self, **kwargs):
        return self.cluster.connect(self.name, **kwargs)

    def link(self, host):
        return self.cluster.link(host)

    def psql(self, host, command, out, settings=(), port=None):
        """psql on `host` running `command` over the host's link, its output and
        messages into the file `out`; `settings` (name, value) for the session, given
        as a DBA would in PGOPTIONS; `port`: another than the server's (PgBouncer's on
        the server's host)."""
        link = self.link(host)
        options = " ".join(f"-c {name}={value}" for name, value in settings)
        env = {**os.environ, "PGOPTIONS": options, "PGCONNECT_TIMEOUT": "10"}
        return link.run(str(self.cluster.bin_dir / "psql"), "-X", "-q", "-h", link.server_addr,
                        "-p", str(port or self.cluster.port), "-U", "postgres", "-d", self.name,
                        "-v", "ON_ERROR_STOP=1", "-c", command,
                        stdout=out, stderr=subprocess.STDOUT, env=env)

    def backends_of(self, host):
        """The pids of the backends whose client is `host`."""
        with self.connect() as conn:
            return [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE client_addr = %s", (self.link(host).addr,))]


@pytest.fixture
def net_db(net, request):
    name = "net_" + str(abs(hash(request.node.name)) % 10**8)
    with net.connect("postgres") as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    db = NetDb(net, name)
    with db.connect() as conn:
        conn.execute("CREATE EXTENSION etc_batch")
    try:
        yield db
    finally:
        for link in net.links.values():
            link.mend()
        with net.connect("postgres") as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


BOUNCER_PORT = 55513


@contextlib.contextmanager
def pgbouncer(cluster, ns, listen_addr, settings=()):
    """A real PgBouncer in transaction mode in namespace `ns` (None: the machine's own,
    on loopback), listening on listen_addr:55513, pooling connections to `cluster`
    through its Unix socket; `settings`: lines for its [pgbouncer] section."""
    directory = HOME / "pgbouncer"
    subprocess.run(["rm", "-rf", str(directory)], check=True)
    directory.mkdir(parents=True)
    (directory / "users.txt").write_text('"postgres" ""\n')
    log = directory / "pgbouncer.log"
    extra = "\n".join(settings)
    (directory / "pgbouncer.ini").write_text(f"""[databases]
* = host={cluster.socket_dir} port={cluster.port}

[pgbouncer]
listen_addr = {listen_addr}
listen_port = {BOUNCER_PORT}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
pool_mode = transaction
default_pool_size = 4
max_client_conn = 50
ignore_startup_parameters = extra_float_digits,options
admin_users = postgres
logfile = {log}
pidfile = {directory / "pgbouncer.pid"}
{extra}
""")
    subprocess.run(["chown", "-R", "postgres:postgres", str(directory)], check=True)
    command = ["runuser", "-u", "postgres", "--", "/usr/sbin/pgbouncer", str(directory / "pgbouncer.ini")]
    proc = subprocess.Popen(in_ns(ns, *command) if ns else command,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: log.exists() and f"listening on {listen_addr}:{BOUNCER_PORT}" in log.read_text(),
                   "pgbouncer listening")
        yield f"host={listen_addr} port={BOUNCER_PORT}"
    finally:
        pidfile = directory / "pgbouncer.pid"
        if pidfile.exists():
            subprocess.run(["kill", pidfile.read_text().strip()], check=False)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
