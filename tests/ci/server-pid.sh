# Sourced by own-postgres.sh and citus.sh: whether a data directory's server is running, and the
# removal of the lock files a server that no longer runs left behind.
#
# A machine or container stopped without a shutdown leaves postmaster.pid (and the socket's .lock)
# behind, naming a PID that another process may hold after the restart. Both checks PostgreSQL
# makes then go wrong: `pg_ctl status` calls the server running when that PID belongs to any process
# of the same user, and the postmaster refuses to start ("lock file ... already exists") when it
# belongs to a process of its user other than itself, e.g. the checkpointer of a server started a
# moment before. So the server counts as running only if the file's PID has the data directory as
# its working directory (a postmaster and its children chdir there); otherwise the files are stale.

server_running() {  # DATA
  local pid
  pid=$(head -n 1 "$1/postmaster.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$(readlink -f "$1")" ]
}

clear_stale_pid() {  # DATA SOCKET_DIR PORT: remove the lock files of a server that is not running
  [ -e "$1/postmaster.pid" ] || return 0
  server_running "$1" && return 0
  printf 'removing %s/postmaster.pid left by a server that no longer runs (PID %s is not it)\n' \
    "$1" "$(head -n 1 "$1/postmaster.pid")" >&2
  rm -f "$1/postmaster.pid" "$2/.s.PGSQL.$3.lock" "$2/.s.PGSQL.$3"
}
