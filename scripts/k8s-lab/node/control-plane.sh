#!/bin/sh
# control-plane.sh IP — etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler of the lab, inside the control-plane container. Logs go to
# /var/log/lab/*.log in the container.
set -eu
IP=$1
P=/lab/pki
mkdir -p /var/log/lab
etcd --name cp --data-dir /var/lib/etcd/data \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --quota-backend-bytes 2147483648 \
	>/var/log/lab/etcd.log 2>&1 &
kube-apiserver --etcd-servers http://127.0.0.1:2379 \
	--advertise-address "$IP" --bind-address "$IP" --secure-port 6443 \
	--client-ca-file $P/ca.crt --tls-cert-file $P/apiserver.crt --tls-private-key-file $P/apiserver.key \
	--kubelet-client-certificate $P/admin.crt --kubelet-client-key $P/admin.key \
	--kubelet-preferred-address-types InternalIP \
	--service-account-key-file $P/sa.pub --service-account-signing-key-file $P/sa.key \
	--service-account-issuer https://kubernetes.default.svc \
	--service-cluster-ip-range 10.96.0.0/16 \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction,ResourceQuota \
	--max-requests-inflight 800 --max-mutating-requests-inflight 400 \
	>/var/log/lab/kube-apiserver.log 2>&1 &
# The controller manager and scheduler give up when the API server is not
# healthy within seconds (it is slower on a loaded machine): keep them up.
keep() {
	log=$1
	shift
	while :; do
		"$@" >>"$log" 2>&1 || true
		sleep 1
	done
}
# Short node-monitor grace periods: a killed node is NotReady in ~12 s
# instead of ~50 s (the node-loss tests wait for it).
keep /var/log/lab/kube-controller-manager.log kube-controller-manager --kubeconfig /lab/kubeconfig \
	--service-account-private-key-file $P/sa.key --root-ca-file $P/ca.crt \
	--leader-elect=false --use-service-account-credentials=false \
	--node-monitor-period 2s --node-monitor-grace-period 12s \
	--kube-api-qps 200 --kube-api-burst 400 --concurrent-gc-syncs 20 &
keep /var/log/lab/kube-scheduler.log kube-scheduler --kubeconfig /lab/kubeconfig --leader-elect=false \
	--kube-api-qps 200 --kube-api-burst 400 &
wait
