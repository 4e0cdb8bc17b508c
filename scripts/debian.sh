# Debian roots: whole Debian systems made with debootstrap under target/debian, in which
# programs of another Debian release run (chroot), as on a machine of that release.
# PostgreSQL 17 is Debian 13's, and its programs need Debian 13's C library: the tests
# build etc_batch for it and run it inside a Debian 13 root. The package tests install
# the packages into fresh copies of a root that has only Debian's PostgreSQL.
# Sourced by lib.sh; needs root (or sudo) for debootstrap, chroot and mounts.

DEBIAN_DIR="$ROOT/target/debian"
DEBIAN_MIRROR=${ETC_BATCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
declare -A DEBIAN_RELEASE_OF=([15]=bookworm [17]=trixie)
declare -A DEBIAN_MAJOR_OF=([bookworm]=15 [trixie]=17)

# What the build root adds to Debian's PostgreSQL: what cargo pgrx builds and tests with,
# and the pg_cron and pg_partman of that release.
debian_build_packages() {
    local major=$1
    echo "postgresql-server-dev-$major postgresql-$major-cron postgresql-$major-partman" \
        "clang libclang-dev gcc libc6-dev dpkg-dev sudo ca-certificates"
}

# debian_root RELEASE KIND: the path of root RELEASE-KIND under target/debian, made if it
# is not there yet (kept between runs: making one takes a minute).
#   pg     debootstrap's minimal system and Debian's postgresql-<major>: what a DBA's
#          server has before etc_batch. Never changed once made; tests copy it.
#   build  the pg root and debian_build_packages, for building and testing etc_batch.
# The postgres OS user has the same ids in the root as on this machine, so that files under
# target/ belong to the same user inside and out.
debian_root() {
    local release=$1 kind=$2
    local major=${DEBIAN_MAJOR_OF[$release]} dir="$DEBIAN_DIR/$release-$kind"
    [ -f "$dir/.made" ] && { echo "$dir"; return 0; }
    as_root rm -rf "$dir"
    as_root mkdir -p "$DEBIAN_DIR"
    if [ "$kind" = pg ]; then
        log "making a Debian $release root with postgresql-$major (debootstrap, a minute)"
        as_root debootstrap --variant=minbase "$release" "$dir" "$DEBIAN_MIRROR" >"$DEBIAN_DIR/$release-$kind.log" 2>&1 \
            || { tail -20 "$DEBIAN_DIR/$release-$kind.log" >&2; return 1; }
        # services are not started in a root (there is no init in it)
        printf '#!/bin/sh\nexit 101\n' | as_root tee "$dir/usr/sbin/policy-rc.d" >/dev/null
        as_root chmod 755 "$dir/usr/sbin/policy-rc.d"
        as_root chroot "$dir" groupadd -g "$(id -g "$PG_OS_USER")" postgres
        as_root chroot "$dir" useradd -r -u "$(id -u "$PG_OS_USER")" -g "$(id -g "$PG_OS_USER")" \
            -d /var/lib/postgresql -s /bin/bash postgres
        debian_apt "$dir" "postgresql-$major"
    else
        local template
        template=$(debian_root "$release" pg)
        log "making a Debian $release build root"
        as_root cp -a "$template" "$dir"
        as_root rm -f "$dir/.made"
        # shellcheck disable=SC2046
        debian_apt "$dir" $(debian_build_packages "$major")
    fi
    as_root touch "$dir/.made"
    echo "$dir"
}

# debian_apt DIR PACKAGE...: apt-get install inside root DIR, without recommends.
debian_apt() {
    local dir=$1; shift
    debian_run "$dir" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "$@" >>"$dir.apt.log" 2>&1 \
        || { as_root tail -30 "$dir.apt.log" >&2; return 1; }
}

# debian_copy RELEASE NAME: a fresh copy of the pg root of RELEASE, target/debian/run/NAME,
# for a test to change as it pleases.
debian_copy() {
    local template dir="$DEBIAN_DIR/run/$2"
    template=$(debian_root "$1" pg)
    as_root rm -rf "$dir"
    as_root mkdir -p "$DEBIAN_DIR/run"
    as_root cp -a "$template" "$dir"
    echo "$dir"
}

# debian_run DIR COMMAND...: COMMAND inside root DIR, as root, in the current directory
# when the root has it (this source tree has: it is mounted at the same path inside), with
# this environment. The mounts (/dev, /proc, the source tree, the Rust toolchain) live in
# a mount namespace of the command's own, so that none outlives it and none is ever under
# target/ when something removes it; a server started inside keeps its namespace while it
# runs. ETC_BATCH_IN_ROOT tells the programs inside that they are inside.
debian_run() {
    local dir=$1; shift
    as_root env -u PGRX_HOME ETC_BATCH_IN_ROOT="$dir" unshare --mount --propagation private -- bash -c '
        set -e
        root=$1 tree=$2 cwd=$3; shift 3
        mount --rbind /dev "$root/dev"
        mount -t proc proc "$root/proc"
        mkdir -p "$root$tree" && mount --bind "$tree" "$root$tree"
        for d in "${CARGO_HOME:-$HOME/.cargo}" "${RUSTUP_HOME:-$HOME/.rustup}"; do
            if [ -d "$d" ] && [ -x "$root/usr/bin/gcc" ]; then
                mkdir -p "$root$d" && mount --bind "$d" "$root$d"
            fi
        done
        [ -d "$root$cwd" ] || cwd=/
        exec chroot "$root" /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$cwd" "$@"
    ' debian_run "$dir" "$ROOT" "$PWD" "$@"
}
