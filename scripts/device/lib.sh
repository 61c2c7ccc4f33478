# Helpers the device scripts source (`. "$(dirname "$0")/lib.sh"`); nothing here runs by itself.

# wait_healthy PORT [PID] [SECONDS]: waits until the server on 127.0.0.1:PORT answers /health
# (0), or until SECONDS (default 120) have passed or process PID has exited (1).
wait_healthy() {
  local port=$1 pid=${2:-} seconds=${3:-120}
  for _ in $(seq 1 "$seconds"); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
      2>/dev/null && return 0
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    sleep 1
  done
  return 1
}
