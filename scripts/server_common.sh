# Shared by scripts/llm_server.sh and scripts/vllm_server.sh (sourced, not run): a free port, waiting for
# /health, running a command beside a background server, and the install | serve | run verbs. The caller
# defines die(), install() and server_cmd() (which fills SERVER_CMD, an array, and URL, the server's /v1 base
# URL) and sets PY (a python) and HEALTH_TIMEOUT_S.

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

wait_healthy() { # PID LOG
  local deadline=$((SECONDS + HEALTH_TIMEOUT_S))
  until curl -fsS -o /dev/null "${URL%/v1}/health" 2>/dev/null; do
    if ! kill -0 "$1" 2>/dev/null; then
      tail -n 40 "$2" >&2
      die "the server exited before it became healthy (log above)"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 40 "$2" >&2
      die "the server was not healthy within $HEALTH_TIMEOUT_S s (log above)"
    fi
    sleep 0.5
  done
}

run_beside_server() { # URL_VAR CMD [ARGS...]: start SERVER_CMD, wait for /health, run CMD with URL_VAR=$URL
  local var=$1 log status
  shift
  log=$(mktemp -t admit-server.XXXXXX.log)
  # its own process group (vLLM runs an API server, an engine core and a worker): stopping it stops them all.
  # Not its own session (setsid): Linux's autogroup scheduler weighs each session as one, so a server in a new
  # session escapes the priority of the command beside it. With the tests' session at a low priority (its
  # autogroup at nice 19), vLLM's busy threads, alone in a session at full weight, left the gateway the tests
  # start runnable but waiting for a CPU for minutes: what failed CI's real-vLLM tests (~1 s of CPU in 138 s).
  "$PY" -c 'import os, sys; os.setpgid(0, 0); os.execvp(sys.argv[1], sys.argv[1:])' "${SERVER_CMD[@]}" >"$log" 2>&1 &
  SERVER_PID=$!
  SERVER_LOG=$log
  # the server's own exit status (143 when SIGTERM ends it) must not replace CMD's: set -e stays on in the trap
  trap 'kill -- -"$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true; rm -f "$SERVER_LOG"' EXIT
  wait_healthy "$SERVER_PID" "$log"
  echo "$(basename "$0" .sh): up at $URL ($var)" >&2
  set +e
  env "$var=$URL" "$@"
  status=$?
  set -e
  kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 40 "$log" >&2; die "the server died while CMD ran (log above)"; }
  return "$status"
}

server_main() { # URL_VAR WHAT VERB [ARGS...]: the scripts' command line (WHAT names the model in `serve`)
  local var=$1 what=$2 status=0
  shift 2
  case "${1:-}" in
    install)
      install
      ;;
    serve)
      install
      server_cmd
      echo "$(basename "$0" .sh): serving $what at $URL" >&2
      exec "${SERVER_CMD[@]}"
      ;;
    run)
      shift
      [ $# -gt 0 ] || die "usage: $0 run CMD [ARGS...]"
      install
      server_cmd
      run_beside_server "$var" "$@" || status=$?
      exit "$status"
      ;;
    *)
      die "usage: $0 install | serve | run CMD [ARGS...]"
      ;;
  esac
}
