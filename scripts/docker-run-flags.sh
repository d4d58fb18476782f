#!/usr/bin/env bash
# Per-flag cost of `docker run -d` on the current engine (issue 20): each
# variant adds the flags the sandbox backend sets (init, -i, dropped
# capabilities, no-new-privileges, limits, a read-only bind mount, --rm)
# to a bare `docker run -d --network none --log-driver none IMAGE sleep`,
# variants alternating round by round so load falls on all alike; `run`
# and the following `rm -f` are timed separately. Prints one line per
# variant: n, run p50, rm p50 (ms) and run p50 / the bare run's p50.
#
#   scripts/docker-run-flags.sh [N]        (default 20 rounds)
#   DOCKER_HOST=tcp://… scripts/docker-run-flags.sh   (scripts/current-engine.sh)
#
# Containers carry the label io.rollout.bench=flags and are removed at once.
set -euo pipefail
n=${1:-20}
img=${IMAGE:-rollout-sandbox:busybox}
mnt=$(mktemp)
trap 'rm -f "$mnt"' EXIT
caps="--cap-drop ALL --cap-add CHOWN --cap-add SETUID --cap-add SETGID --cap-add KILL"
lim="-m 2g --memory-swap 2g --cpus 1 --pids-limit 512"
declare -A V=(
	[base]=""
	[init]="--init"
	[interactive]="-i"
	[capdrop]="$caps"
	[nnp]="--security-opt no-new-privileges"
	[limits]="$lim"
	[bind]="-v $mnt:/x:ro"
	[autorm]="--rm"
	[all]="--init -i $caps --security-opt no-new-privileges $lim -v $mnt:/x:ro --rm"
)
order=(base init interactive capdrop nnp limits bind autorm all)
raw=$(mktemp)
trap 'rm -f "$mnt" "$raw"' EXIT
for _ in $(seq "$n"); do
	for v in "${order[@]}"; do
		t0=$(date +%s%N)
		# shellcheck disable=SC2086
		id=$(docker run -d --label io.rollout.bench=flags --network none --log-driver none ${V[$v]} "$img" sleep 3600)
		t1=$(date +%s%N)
		docker rm -f "$id" >/dev/null
		t2=$(date +%s%N)
		echo "$v $(((t1 - t0) / 1000)) $(((t2 - t1) / 1000))" >>"$raw"
	done
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
base=$(awk '$1=="base"{print $2}' "$raw" | median)
for v in "${order[@]}"; do
	run=$(awk -v v="$v" '$1==v{print $2}' "$raw" | median)
	rm=$(awk -v v="$v" '$1==v{print $3}' "$raw" | median)
	awk -v v="$v" -v n="$n" -v r="$run" -v m="$rm" -v b="$base" \
		'BEGIN {printf "%-12s n=%d  run p50 %7.1f ms  rm p50 %7.1f ms  run/bare %.2f\n", v, n, r/1000, m/1000, r/b}'
done
