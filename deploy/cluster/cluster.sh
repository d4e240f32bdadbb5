#!/usr/bin/env bash
# cluster.sh: greendot's cluster topology, the same as compose.yaml, as local
# processes on loopback, for machines without Docker: three NATS servers
# reading nats.conf, the buckets set up by the operator, two gateways, two
# reapers and two fanouts. Logs, pids, passwords and NATS storage live under
# a run directory.
#
#   deploy/cluster/cluster.sh up       start everything (task cluster)
#   deploy/cluster/cluster.sh down     stop everything, gateways first so they
#                                      drain (task cluster:down)
#   deploy/cluster/cluster.sh status   what runs, and whether it is ready
#
# Environment:
#   GREENDOT_BIN_DIR      where greendot and nats-server are      (bin);
#                         up notes it in the run directory, so that
#                         down and status find its processes without it
#   GREENDOT_RUN_DIR      logs, pids, secrets, NATS storage       (.run/cluster)
#   GREENDOT_PORT_OFFSET  added to every port below, to run a second copy (0)
#
# Ports (plus the offset): NATS clients 4222-4224, routes 6222-6224,
# monitoring 8222-8224; gateways 8081 and 8082 (/ws, the HTTP API, /healthz,
# /readyz, /metrics); reapers' health and metrics 9101-9102, fanouts'
# 9201-9202. The data survives `down`: `up` again restarts the same cluster
# with its state; remove the run directory to start afresh.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${GREENDOT_BIN_DIR:-$root/bin}
run=${GREENDOT_RUN_DIR:-$root/.run/cluster}
off=${GREENDOT_PORT_OFFSET:-0}

port() { echo $(($1 + off)); }
nats_urls() { echo "nats://127.0.0.1:$(port 4222),nats://127.0.0.1:$(port 4223),nats://127.0.0.1:$(port 4224)"; }

# The processes, in start order; down stops them in reverse.
nats_nodes=(n1 n2 n3)
workers=(reaper1 reaper2 fanout1 fanout2)
gateways=(gateway1 gateway2)

die() { echo "cluster: $*" >&2; exit 1; }

# alive reports whether the process of a pid file runs, and is ours: a
# binary of the bin directory up noted (a pid may have been reused by
# another program since).
alive() {
	local f=$run/$1.pid pid from=$bin
	[[ -f $f ]] || return 1
	[[ -f $run/bin-dir ]] && from=$(<"$run/bin-dir")
	pid=$(<"$f")
	kill -0 "$pid" 2>/dev/null || return 1
	ps -p "$pid" -o command= 2>/dev/null | grep -qF "$from/"
}

# start runs a command in the background, detached from this shell, with
# its output in <name>.log and its pid in <name>.pid.
start() {
	local name=$1
	shift
	nohup "$@" >"$run/$name.log" 2>&1 </dev/null &
	echo $! >"$run/$name.pid"
}

# wait_http waits until a URL answers 200, or fails with the log of the
# process that should answer it.
wait_http() {
	local name=$1 url=$2 i
	for ((i = 0; i < 120; i++)); do
		if curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null; then
			return 0
		fi
		alive "$name" || { tail -n 30 "$run/$name.log" >&2; die "$name exited; its log is $run/$name.log"; }
		sleep 0.5
	done
	tail -n 30 "$run/$name.log" >&2
	die "$name did not answer $url within 60s; its log is $run/$name.log"
}

# secrets creates the run directory's passwords once, and loads them.
secrets() {
	local f=$run/secrets.env role
	(
		umask 077
		touch "$f"
		# Every role's password, and the roles added since the file was
		# written.
		for role in ROUTE GATEWAY REAPER FANOUT WEBHOOKS OPERATOR SYS; do
			if ! grep -q "^NATS_${role}_PASSWORD=" "$f"; then
				# A leading letter: nats.conf must not read it as a number.
				echo "NATS_${role}_PASSWORD=p$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" >>"$f"
			fi
		done
	)
	set -a
	# shellcheck disable=SC1090
	. "$f"
	set +a
}

up() {
	command -v curl >/dev/null || die "curl is needed to wait for health checks"
	for b in greendot nats-server; do
		[[ -x $bin/$b ]] || die "$bin/$b is missing: run task build build:nats (or task cluster)"
	done
	bin=$(cd "$bin" && pwd)
	mkdir -p "$run"
	for name in "${nats_nodes[@]}" "${workers[@]}" "${gateways[@]}"; do
		alive "$name" && die "$name already runs (pid $(<"$run/$name.pid")): task cluster:down first"
		rm -f "$run/$name.pid"
	done
	echo "$bin" >"$run/bin-dir"
	secrets

	local routes="" i name
	for i in 0 1 2; do
		routes+="${routes:+, }\"nats-route://route:$NATS_ROUTE_PASSWORD@127.0.0.1:$(port $((6222 + i)))\""
	done
	for i in 0 1 2; do
		name=${nats_nodes[$i]}
		mkdir -p "$run/data/$name"
		start "$name" env \
			NATS_SERVER_NAME="$name" \
			NATS_LISTEN="127.0.0.1:$(port $((4222 + i)))" \
			NATS_HTTP="127.0.0.1:$(port $((8222 + i)))" \
			NATS_CLUSTER_LISTEN="127.0.0.1:$(port $((6222 + i)))" \
			NATS_ROUTES="[$routes]" \
			NATS_STORE_DIR="$run/data/$name" \
			"$bin/nats-server" --config "$root/nats.conf"
	done
	for i in 0 1 2; do
		wait_http "${nats_nodes[$i]}" "http://127.0.0.1:$(port $((8222 + i)))/healthz"
	done

	# The operator sets the buckets up; the other roles may not.
	local ok=""
	for ((i = 0; i < 30; i++)); do
		if GREENDOT_NATS_USER=operator GREENDOT_NATS_PASSWORD=$NATS_OPERATOR_PASSWORD \
			"$bin/greendot" buckets --nats-url "$(nats_urls)" --replicas 3 >"$run/buckets.log" 2>&1; then
			ok=1
			break
		fi
		sleep 1
	done
	[[ -n $ok ]] || { cat "$run/buckets.log" >&2; die "greendot buckets failed"; }

	local common=(--nats-url "$(nats_urls)" --replicas 3 --log-format json)
	for i in 1 2; do
		start "reaper$i" env GREENDOT_NATS_USER=reaper GREENDOT_NATS_PASSWORD="$NATS_REAPER_PASSWORD" \
			"$bin/greendot" reaper "${common[@]}" --metrics-listen "127.0.0.1:$(port $((9100 + i)))"
		start "fanout$i" env GREENDOT_NATS_USER=fanout GREENDOT_NATS_PASSWORD="$NATS_FANOUT_PASSWORD" \
			"$bin/greendot" fanout "${common[@]}" --metrics-listen "127.0.0.1:$(port $((9200 + i)))"
		start "gateway$i" env GREENDOT_NATS_USER=gateway GREENDOT_NATS_PASSWORD="$NATS_GATEWAY_PASSWORD" \
			"$bin/greendot" gateway "${common[@]}" --listen "127.0.0.1:$(port $((8080 + i)))" \
			--gateway-id "gw$i" --drain-period 10s --dev-auth
	done
	for i in 1 2; do
		wait_http "reaper$i" "http://127.0.0.1:$(port $((9100 + i)))/readyz"
		wait_http "fanout$i" "http://127.0.0.1:$(port $((9200 + i)))/readyz"
		wait_http "gateway$i" "http://127.0.0.1:$(port $((8080 + i)))/readyz"
	done

	cat <<EOF
greendot cluster is up; logs, pids and data in $run
  gateways  ws://127.0.0.1:$(port 8081)/ws  ws://127.0.0.1:$(port 8082)/ws   (dev auth: ?user=<id>)
  NATS      $(nats_urls)
            monitoring http://127.0.0.1:$(port 8222)/  (and $(port 8223), $(port 8224))
  operator  user "operator", password in $run/secrets.env:
            . $run/secrets.env; $bin/greendot graph follow --nats-url nats://127.0.0.1:$(port 4222) \\
              --nats-user operator --nats-password "\$NATS_OPERATOR_PASSWORD" --replicas 3 alice bob
  stop      task cluster:down
EOF
}

# stop ends one process with SIGTERM, then SIGKILL after timeout seconds.
stop() {
	local name=$1 timeout=$2 pid i
	if ! alive "$name"; then
		rm -f "$run/$name.pid"
		return 0
	fi
	pid=$(<"$run/$name.pid")
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < timeout * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "cluster: $name did not stop within ${timeout}s: killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$run/$name.pid"
	echo "stopped $name"
}

down() {
	[[ -d $run ]] || { echo "cluster: nothing runs ($run does not exist)"; return 0; }
	local name
	# Gateways first, at once: they drain their sockets (1001) over 10s.
	for name in "${gateways[@]}"; do stop "$name" 30 & done
	wait
	for name in "${workers[@]}"; do stop "$name" 15 & done
	wait
	for name in "${nats_nodes[@]}"; do stop "$name" 15; done
}

status() {
	local name url
	for name in "${nats_nodes[@]}" "${workers[@]}" "${gateways[@]}"; do
		case $name in
		n1) url=http://127.0.0.1:$(port 8222)/healthz ;;
		n2) url=http://127.0.0.1:$(port 8223)/healthz ;;
		n3) url=http://127.0.0.1:$(port 8224)/healthz ;;
		reaper*) url=http://127.0.0.1:$(port $((9100 + ${name#reaper})))/readyz ;;
		fanout*) url=http://127.0.0.1:$(port $((9200 + ${name#fanout})))/readyz ;;
		gateway*) url=http://127.0.0.1:$(port $((8080 + ${name#gateway})))/readyz ;;
		esac
		if ! alive "$name"; then
			printf '%-9s stopped\n' "$name"
		elif curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null; then
			printf '%-9s ready    pid %s  %s\n' "$name" "$(<"$run/$name.pid")" "$url"
		else
			printf '%-9s running  pid %s  not ready: %s\n' "$name" "$(<"$run/$name.pid")" "$url"
		fi
	done
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
*) die "usage: $0 up|down|status" ;;
esac
