#!/usr/bin/env bash
# The operator's own PostgreSQL, for the test suite: Debian's PostgreSQL 15, pgvector built from
# the vendored source, `CREATE EXTENSION vector` done once by the superuser in template1, an
# unprivileged login role `memctl` (CREATEDB, not superuser) with a random password, and a second
# one, `memctl_dba` (CREATEROLE and CREATEDB, not superuser): the DBA who runs what `memctl agent add
# --print-sql` prints for `memctl`, and an owner that makes agents' roles itself (its URL, naming the
# same passfile, is written to $STATE/dba-url).
#
#   url=$(bash tests/ci/own-postgres.sh)      # then MEMCTL_TEST_DATABASE_URL=$url pytest ...
#   MEMCTL_TEST_CREATEROLE_URL=$(cat /root/.memctl-ci/dba-url)   # the agents tests' second role
#
# Run as root; the server runs as the `postgres` OS user, on 127.0.0.1 only, with scram
# password authentication. stdout is one line, the URL. It holds no secret: the password is in
# a passfile only root can read, named by the URL's `passfile` parameter. Rerunning is safe:
# each step checks what is already there (packages, build, cluster, server, extension, role).
set -euo pipefail

PORT=${MEMCTL_CI_PG_PORT:-55432}
PG_BIN=/usr/lib/postgresql/15/bin
BASE=/var/lib/postgresql/memctl-ci
DATA=$BASE/15
SOCKETS=$BASE/run
STATE=${MEMCTL_CI_STATE:-/root/.memctl-ci}
PASSFILE=$STATE/pgpass
here=$(cd "$(dirname "$0")" && pwd)
TARBALL=${MEMCTL_CI_PGVECTOR_TARBALL:-$here/../../../shared/vendor/pgvector/pgvector-e48241b.tar.gz}
TARBALL_SHA256=f8895668f3311a115f6a4b58b2ba2461c92cc296304d2b2a68ebdd640009fe8e

say() { printf 'own-postgres: %s\n' "$*" >&2; }
. "$here/server-pid.sh"
as_postgres() { runuser -u postgres -- "$@"; }
psql_super() {  # SQL on stdin, as the superuser over the Unix socket (peer authentication)
  as_postgres "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCKETS" -p "$PORT" -d "$1"
}

[ "$(id -u)" = 0 ] || { say "run as root (apt-get, make install, runuser)"; exit 1; }

# 1. Debian's PostgreSQL 15 and what building an extension against it needs.
packages=(postgresql-15 postgresql-server-dev-15 make gcc)
if ! dpkg-query -W -f='${Status}\n' "${packages[@]}" 2>/dev/null | grep -c '^install ok installed$' \
     | grep -qx "${#packages[@]}"; then
  say "installing ${packages[*]}"
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}" >&2
fi

# 2. pgvector from the vendored source (pgvector's own README: make, make install, same PG_CONFIG).
control=$("$PG_BIN/pg_config" --sharedir)/extension/vector.control
wanted=$(tar -xzOf "$TARBALL" pgvector-e48241b/vector.control)
if [ "$(cat "$control" 2>/dev/null)" != "$wanted" ] || [ ! -e "$("$PG_BIN/pg_config" --pkglibdir)/vector.so" ]; then
  echo "$TARBALL_SHA256  $TARBALL" | sha256sum --check --quiet - >&2
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  tar -xzf "$TARBALL" -C "$build"
  say "building pgvector ($(grep default_version <<<"$wanted"))"
  make -C "$build/pgvector-e48241b" PG_CONFIG="$PG_BIN/pg_config" >&2
  make -C "$build/pgvector-e48241b" PG_CONFIG="$PG_BIN/pg_config" install >&2
fi

# 3. A cluster of its own (Debian's `main` on 5432 is left alone), owned by postgres.
install -d -o postgres -g postgres -m 0700 "$BASE" "$SOCKETS"
if [ ! -s "$DATA/PG_VERSION" ]; then
  say "initdb $DATA"
  as_postgres "$PG_BIN/initdb" -D "$DATA" -U postgres --encoding=UTF8 --locale=C.UTF-8 \
    --auth-local=peer --auth-host=scram-sha-256 >&2
fi
as_postgres tee "$DATA/memctl-ci.conf" >/dev/null <<CONF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCKETS'
password_encryption = 'scram-sha-256'
CONF
grep -qx "include_if_exists = 'memctl-ci.conf'" "$DATA/postgresql.conf" \
  || echo "include_if_exists = 'memctl-ci.conf'" | as_postgres tee -a "$DATA/postgresql.conf" >/dev/null
as_postgres tee "$DATA/pg_hba.conf" >/dev/null <<'HBA'
# TYPE  DATABASE  USER      ADDRESS        METHOD
local   all       postgres                 peer
host    all       all       127.0.0.1/32   scram-sha-256
HBA

clear_stale_pid "$DATA" "$SOCKETS" "$PORT"
if server_running "$DATA"; then
  as_postgres "$PG_BIN/pg_ctl" -D "$DATA" reload >&2
else
  say "starting the server on 127.0.0.1:$PORT"
  if ! as_postgres "$PG_BIN/pg_ctl" -D "$DATA" -l "$BASE/server.log" -w -t 60 start >&2; then
    tail -n 20 "$BASE/server.log" >&2
    exit 1
  fi
fi

# 4. The extension, once, by the superuser, in template1: every database made later has it.
psql_super template1 <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS vector;
ALTER EXTENSION vector UPDATE;
SQL

# 5. The unprivileged role and its database. The password is made once, kept in a 0600
#    passfile, and goes to the server on stdin with statement logging off for the session,
#    so it reaches neither argv nor the server log.
install -d -m 0700 "$STATE"
touch "$PASSFILE"
chmod 0600 "$PASSFILE"
for role in memctl memctl_dba; do  # one line each: 127.0.0.1:PORT:*:ROLE:PASSWORD
  grep -q "^127\.0\.0\.1:$PORT:\*:$role:" "$PASSFILE" \
    || printf '127.0.0.1:%s:*:%s:%s\n' "$PORT" "$role" "$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" >>"$PASSFILE"
done
password_of() { grep "^127\.0\.0\.1:$PORT:\*:$1:" "$PASSFILE" | head -n 1 | cut -d: -f5; }
password=$(password_of memctl)
dba_password=$(password_of memctl_dba)
psql_super postgres <<SQL
SET log_statement = 'none';
SET log_min_error_statement = 'panic';
\set password '$password'
SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'memctl') AS new_role \gset
\if :new_role
CREATE ROLE memctl LOGIN PASSWORD :'password';
\endif
ALTER ROLE memctl LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'password';
SELECT NOT EXISTS (SELECT FROM pg_database WHERE datname = 'memctl') AS new_db \gset
\if :new_db
CREATE DATABASE memctl OWNER memctl;
\endif
\set dba_password '$dba_password'
SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'memctl_dba') AS new_dba \gset
\if :new_dba
CREATE ROLE memctl_dba LOGIN PASSWORD :'dba_password';
\endif
ALTER ROLE memctl_dba LOGIN CREATEDB CREATEROLE NOSUPERUSER NOREPLICATION NOBYPASSRLS PASSWORD :'dba_password';
SQL
unset password dba_password

# 6. Check it as the tests will use it: over TCP, by password, not a superuser, vector present.
url="postgresql://memctl@127.0.0.1:$PORT/memctl?passfile=$PASSFILE"
check=$("$PG_BIN/psql" -X -At -v ON_ERROR_STOP=1 "$url" -c \
  "SELECT rolsuper, rolcreatedb, (SELECT extversion FROM pg_extension WHERE extname = 'vector')
     FROM pg_roles WHERE rolname = current_user")
[ "${check%|*}" = "f|t" ] || { say "role memctl is not (non-superuser, CREATEDB): $check"; exit 1; }
say "ready: PostgreSQL $("$PG_BIN/postgres" -V | awk '{print $3}'), pgvector ${check##*|}, role memctl (not superuser), role memctl_dba (CREATEROLE)"
dba_url="postgresql://memctl_dba@127.0.0.1:$PORT/memctl?passfile=$PASSFILE"
dba_check=$("$PG_BIN/psql" -X -At -v ON_ERROR_STOP=1 "$dba_url" -c \
  "SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user")
[ "$dba_check" = "f|t" ] || { say "role memctl_dba is not (non-superuser, CREATEROLE): $dba_check"; exit 1; }
(umask 077; echo "$url" >"$STATE/database-url"; echo "$dba_url" >"$STATE/dba-url")
echo "$url"
