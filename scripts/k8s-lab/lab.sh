#!/usr/bin/env bash
# lab.sh up|down|status|load IMAGE...|env — the project's own multi-node
# Kubernetes cluster, in containers on a private Docker network
# (docs/kubernetes.md, "The lab").
#
#   up      build (or take from the cache) the pinned Kubernetes binaries, the
#           node image (Debian containerd/runc/CNI/etcd), the pause and agent
#           images; start a control plane and $K8S_LAB_NODES worker nodes;
#           load the sandbox images into every node; write a kubeconfig for
#           the host into $STATE/kubeconfig. Prints the set-up times.
#   down    remove the containers, their volumes, the network and the nodes'
#           cgroups. The PKI and kubeconfig are removed too.
#   load    import images from the host's Docker engine into every node.
#   env     print `export ROLLOUT_K8S_LAB_KUBECONFIG=…` (and
#           ROLLOUT_K8S_LAB_REGISTRY=127.0.0.1:PORT) for the tests.
#
# The lab also runs a registry (Debian's docker-registry, image
# rollout-registry:bookworm) on its private network, published on the host's
# loopback at a port Docker picks: `rollout sandbox image push --registry
# 127.0.0.1:PORT IMAGE…` pushes there, and the nodes' containerd pulls
# 127.0.0.1:PORT/… from the registry container over plain HTTP
# ($STATE/certs.d/127.0.0.1:PORT/hosts.toml).
#
# Everything the lab creates carries the label io.rollout.lab=$LAB; nothing
# binds to the machine's external interface (the API server listens on the
# private network's address only).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LAB=${K8S_LAB_NAME:-rollout-k8s-lab}
VERSION=${K8S_VERSION:-v1.37.2}
NODES=${K8S_LAB_NODES:-2}
MAX_PODS=${K8S_LAB_MAX_PODS:-160}
CACHE=${K8S_LAB_CACHE:-/var/cache/rollout/k8s}
STATE=${K8S_LAB_STATE:-/var/cache/rollout/k8s-lab/$LAB}
ROLLOUT=${ROLLOUT:-$ROOT/bin/rollout}
AGENT=${ROLLOUT_AGENT:-$ROOT/bin/rollout-agent}
NODE_IMAGE=rollout-k8s-node:bookworm
REGISTRY_IMAGE=rollout-registry:bookworm
PAUSE_IMAGE=rollout-lab/pause:1
# Sandbox images loaded into the nodes (more with `lab.sh load`).
LOAD_IMAGES=${K8S_LAB_IMAGES:-rollout-sandbox:busybox rollout-sandbox:bookworm}
BIN=$CACHE/$VERSION/bin

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "k8s-lab: $*" >&2; }
die() { echo "k8s-lab: $*" >&2; exit 1; }

# agent_ref names the agent image after the binary's content, the same way
# the kubernetes backend does (sandbox.AgentImageRef).
agent_ref() { echo "rollout-agent:$(sha256sum "$AGENT" | cut -c1-12)"; }

pki() {
	local d=$STATE/pki cpip=$1
	mkdir -p "$d"
	cd "$d"
	if [ ! -f ca.crt ]; then
		openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout ca.key -out ca.crt \
			-days 3650 -subj "/CN=$LAB-ca" 2>/dev/null
		openssl genrsa -out sa.key 2048 2>/dev/null
		openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
	fi
	sign apiserver kube-apiserver "" "subjectAltName=IP:$cpip,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:$LAB-cp"
	sign admin lab-admin system:masters ""
	for i in $(seq 1 "$NODES"); do
		sign "$LAB-w$i" "system:node:$LAB-w$i" system:nodes ""
	done
	cd - >/dev/null
}

sign() {
	local n=$1 cn=$2 org=$3 san=$4 subj
	subj="/CN=$cn"
	[ -n "$org" ] && subj="/O=$org$subj"
	openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$n.key" -out "$n.csr" -subj "$subj" 2>/dev/null
	printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n%s\n' "$san" >"$n.ext"
	openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$n.crt" -days 365 -extfile "$n.ext" 2>/dev/null
	rm -f "$n.csr" "$n.ext"
}

kubeconfig() { # name server out
	local n=$1 server=$2 out=$3 d=$STATE/pki
	cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $LAB
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 <"$d/ca.crt")
users:
- name: $n
  user:
    client-certificate-data: $(base64 -w0 <"$d/$n.crt")
    client-key-data: $(base64 -w0 <"$d/$n.key")
contexts:
- name: $LAB
  context: {cluster: $LAB, user: $n}
current-context: $LAB
EOF
}

# node_run NAME: a container that can run containerd and a kubelet
# (docs/kubernetes.md, "Host quirks"). --init: the engine's init is its
# pid 1 and reaps the node's orphans (containerd shims, runc), which
# `sleep` would leave as zombies, hundreds within minutes.
node_run() {
	local name=$1
	docker run -d --init --name "$name" --hostname "$name" --network "$LAB" \
		--label io.rollout.lab="$LAB" \
		--cap-add ALL --cap-drop SYS_RESOURCE \
		--security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined \
		--device-cgroup-rule 'a *:* rwm' --device /dev/kmsg \
		--cgroupns host -v /sys/fs/cgroup:/sys/fs/cgroup:rw -v /lib/modules:/lib/modules:ro \
		--tmpfs /run --tmpfs /tmp \
		-v /var/lib/containerd -v /var/lib/kubelet -v /var/lib/etcd \
		-v "$BIN:/opt/k8s/bin:ro" -v "$STATE:/lab:ro" -v "$HERE/node:/lab-scripts:ro" \
		--entrypoint /bin/sleep "$NODE_IMAGE" infinity >/dev/null
}

ip_of() { docker inspect -f "{{(index .NetworkSettings.Networks \"$LAB\").IPAddress}}" "$1"; }

wait_for() { # what timeout_s cmd...
	local what=$1 t=$2 start
	shift 2
	start=$(date +%s)
	until "$@" >/dev/null 2>&1; do
		[ $(($(date +%s) - start)) -ge "$t" ] && die "timed out after ${t}s waiting for $what"
		sleep 0.3
	done
}

kc() { kubectl --kubeconfig "$STATE/kubeconfig" "$@"; }

images() {
	local t0 ref
	t0=$(now)
	[ -x "$ROLLOUT" ] || die "$ROLLOUT missing: run make build"
	[ -x "$AGENT" ] || die "$AGENT missing: run make build"
	"$ROLLOUT" sandbox image build --name k8s-node >&2
	"$ROLLOUT" sandbox image build --name registry >&2
	"$ROLLOUT" sandbox image build >&2
	mkdir -p "$STATE"
	if ! docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1; then
		local tmp
		tmp=$(mktemp -d)
		(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$tmp/pause" ./internal/testkit/k8slab/pause)
		tar -C "$tmp" -cf - pause | docker import --change 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
		rm -rf "$tmp"
	fi
	ref=$(agent_ref)
	# The tests run the very agent the nodes have (sandbox/kubernetes_test.go).
	cp "$AGENT" "$STATE/rollout-agent"
	if ! docker image inspect "$ref" >/dev/null 2>&1; then
		local tmp
		tmp=$(mktemp -d)
		cp "$AGENT" "$tmp/rollout-agent"
		tar -C "$tmp" -cf - rollout-agent | docker import --change 'ENTRYPOINT ["/rollout-agent"]' - "$ref" >/dev/null
		rm -rf "$tmp"
	fi
	log "images ready in $(since "$t0") s (node, registry, pause, agent $ref, sandbox images)"
}

# registry_up starts the lab's registry on the private network, published on
# the host's loopback only, and writes the nodes' containerd host config for
# it: the name the host pushes to (127.0.0.1:PORT) resolves, inside the
# nodes, to the registry container's private address over plain HTTP.
registry_up() {
	local port ip reg
	docker run -d --name "$LAB-registry" --network "$LAB" --label io.rollout.lab="$LAB" \
		-p 127.0.0.1::5000 -v /var/lib/docker-registry "$REGISTRY_IMAGE" >/dev/null
	port=$(docker port "$LAB-registry" 5000/tcp | head -1 | sed 's/.*://')
	[ -n "$port" ] || die "the registry container published no port"
	ip=$(ip_of "$LAB-registry")
	reg=127.0.0.1:$port
	rm -rf "$STATE/certs.d"
	mkdir -p "$STATE/certs.d/$reg"
	printf 'server = "http://%s"\n\n[host."http://%s:5000"]\n  capabilities = ["pull", "resolve"]\n' "$reg" "$ip" \
		>"$STATE/certs.d/$reg/hosts.toml"
	echo "$reg" >"$STATE/registry"
	wait_for "the registry" 30 curl -fs "http://$reg/v2/"
	log "registry $reg (private $ip:5000)"
}

load() { # images... into every node
	local t0
	t0=$(now)
	docker save "$@" -o "$STATE/images.tar"
	# Every node's import must succeed: a node without the agent image
	# fails every pod scheduled there (ErrImageNeverPull).
	local pids=() failed=0 i
	for i in $(seq 1 "$NODES"); do
		docker exec "$LAB-w$i" ctr -n k8s.io images import --no-unpack=false /lab/images.tar >/dev/null &
		pids+=($!)
	done
	for i in $(seq 1 "$NODES"); do
		wait "${pids[$((i - 1))]}" || { log "importing into $LAB-w$i failed"; failed=1; }
	done
	rm -f "$STATE/images.tar"
	[ "$failed" = 0 ] || die "loading images into the nodes failed"
	log "loaded $* into $NODES nodes in $(since "$t0") s"
}

# need_tools installs what the lab runs on the host when missing (a fresh CI
# machine): kubectl (Debian's kubernetes-client), openssl, curl, flock.
need_tools() {
	local missing=() t
	for t in kubectl:kubernetes-client openssl:openssl curl:curl flock:util-linux; do
		command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
	done
	[ ${#missing[@]} = 0 ] && return 0
	[ "$(id -u)" = 0 ] || die "missing ${missing[*]}: install them (apt-get install ${missing[*]})"
	log "installing ${missing[*]} (apt)"
	"$HERE/../apt-install.sh" "${missing[@]}" >/dev/null || die "could not install ${missing[*]}"
}

up() {
	local t0 tb cpip
	t0=$(now)
	need_tools
	if docker inspect "$LAB-cp" >/dev/null 2>&1; then
		die "$LAB is already up (lab.sh down first)"
	fi
	tb=$(now)
	"$HERE/build-k8s.sh" "$VERSION" >&2
	log "kubernetes $VERSION binaries ready in $(since "$tb") s"
	images
	rm -rf "$STATE/pki" "$STATE/kubeconfig"
	mkdir -p "$STATE"
	docker network inspect "$LAB" >/dev/null 2>&1 || docker network create --label io.rollout.lab="$LAB" "$LAB" >/dev/null
	local tc
	tc=$(now)
	node_run "$LAB-cp"
	for i in $(seq 1 "$NODES"); do node_run "$LAB-w$i"; done
	registry_up
	cpip=$(ip_of "$LAB-cp")
	pki "$cpip"
	kubeconfig admin "https://$cpip:6443" "$STATE/kubeconfig"
	for i in $(seq 1 "$NODES"); do
		kubeconfig "$LAB-w$i" "https://$cpip:6443" "$STATE/$LAB-w$i.kubeconfig"
	done
	chmod -R go-rwx "$STATE/pki" "$STATE"/*.kubeconfig "$STATE/kubeconfig"
	docker exec -d "$LAB-cp" /lab-scripts/control-plane.sh "$cpip"
	wait_for "the API server" 120 kc get --raw /readyz
	for i in $(seq 1 "$NODES"); do
		docker exec -d "$LAB-w$i" /lab-scripts/worker.sh "$LAB-w$i" "$(ip_of "$LAB-w$i")" "$i" "$MAX_PODS"
	done
	for i in $(seq 1 "$NODES"); do
		wait_for "containerd on $LAB-w$i" 120 docker exec "$LAB-w$i" ctr version
	done
	# The pause, agent and sandbox images go into every node's containerd.
	load "$PAUSE_IMAGE" "$(agent_ref)" $LOAD_IMAGES
	wait_for "$NODES Ready nodes" 180 sh -c "[ \$(kubectl --kubeconfig '$STATE/kubeconfig' get nodes --no-headers 2>/dev/null | grep -c ' Ready') -ge $NODES ]"
	# Pods need the namespace's default service account (controller manager).
	wait_for "the default service account" 120 kc get serviceaccount default
	log "cluster up in $(since "$tc") s (containers, PKI, control plane, $NODES nodes Ready, images loaded)"
	log "total set-up $(since "$t0") s; kubeconfig: $STATE/kubeconfig"
	env_out
}

env_out() {
	echo "export ROLLOUT_K8S_LAB_KUBECONFIG=$STATE/kubeconfig"
	[ -f "$STATE/registry" ] && echo "export ROLLOUT_K8S_LAB_REGISTRY=$(cat "$STATE/registry")"
	return 0
}

down() {
	local ids n c
	ids=$(docker ps -aq --filter label=io.rollout.lab="$LAB")
	[ -n "$ids" ] && docker rm -f -v $ids >/dev/null
	docker network rm "$LAB" >/dev/null 2>&1 || true
	# The nested kubelets' cgroups (per-node cgroup root) outlive the nodes.
	for n in $(seq 1 "$NODES"); do
		for c in /sys/fs/cgroup/*/"$LAB-w$n"; do
			[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
		done
	done
	rm -rf "$STATE/pki" "$STATE"/*.kubeconfig "$STATE/kubeconfig" "$STATE/images.tar" "$STATE/rollout-agent" \
		"$STATE/certs.d" "$STATE/registry"
	log "down"
}

status() {
	docker ps --filter label=io.rollout.lab="$LAB" --format '{{.Names}}\t{{.Status}}'
	[ -f "$STATE/kubeconfig" ] && kc get nodes -o wide || true
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
load) shift; [ $# -gt 0 ] || die "usage: lab.sh load IMAGE..."; load "$@" ;;
env) env_out ;;
images) images ;;
*) die "usage: lab.sh up|down|status|load IMAGE...|env" ;;
esac
