#!/usr/bin/env bash
# tests/nginx/start.sh PREFIX ROOT MANIFESTS REV [LIFETIME]: starts a loopback
# nginx from mirror.conf.in on two free ports, prints "PORT1 PORT2", and
# leaves its pid in PREFIX/run.pid. It is wrapped in `timeout LIFETIME`
# (default 300 s) so it always ends by itself; stop it earlier with
# kill "$(cat PREFIX/run.pid)".
set -eu
prefix=$1 root=$2 manifests=$3 rev=$4 life=${5:-300}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$prefix/tmp"
read -r p1 p2 < <(python3 -c '
import socket
s=[socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1",0))
print(*[x.getsockname()[1] for x in s])')
sed -e "s|@PREFIX@|$prefix|g" -e "s|@ROOT@|$root|g" -e "s|@MANIFESTS@|$manifests|g" \
    -e "s|@PORT1@|$p1|g" -e "s|@PORT2@|$p2|g" -e "s|@REV@|$rev|g" \
    -e "s|@USER@|$(id -un)|g" -e "s|@GROUP@|$(id -gn)|g" \
    "$here/mirror.conf.in" > "$prefix/nginx.conf"
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
timeout "$life" "$NGINX" -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/error.log" 2>>"$prefix/error.log" &
echo $! > "$prefix/run.pid"
# wait (bounded) until both ports answer
for _ in $(seq 100); do
	if curl -s -o /dev/null "http://127.0.0.1:$p1/" && curl -s -o /dev/null "http://127.0.0.1:$p2/"; then
		echo "$p1 $p2"
		exit 0
	fi
	sleep 0.05
done
echo "nginx did not start: $(tail -n 5 "$prefix/error.log")" >&2
kill "$(cat "$prefix/run.pid")" 2>/dev/null || true
exit 1
