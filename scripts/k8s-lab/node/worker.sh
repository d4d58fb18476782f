#!/bin/sh
# worker.sh NAME IP INDEX MAX_PODS — containerd and a kubelet inside a lab
# node container. Logs go to /var/log/lab/*.log in the container.
set -eu
NAME=$1 IP=$2 I=$3 MAXPODS=$4
mkdir -p /var/log/lab /etc/containerd /etc/cni/net.d /var/lib/kubelet
# A nested kubelet needs its own cgroup root, present in every v1 controller.
for c in /sys/fs/cgroup/*/; do
	[ -L "${c%/}" ] && continue
	mkdir -p "$c$NAME"
done
# restrict_oom_score_adj: the VM's bounding set lacks CAP_SYS_RESOURCE, so
# runc cannot lower oom_score_adj below the node's own (-998 for the pod
# sandbox otherwise fails with "can't get final child's PID from pipe").
cat >/etc/containerd/config.toml <<TOML
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/rollout-lab/pause:1"
  restrict_oom_score_adj = true
  max_concurrent_downloads = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  # The lab's registry (lab.sh writes /lab/certs.d/<host:port>/hosts.toml:
  # the name the host pushes to, served over plain HTTP from the registry
  # container's private address).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/lab/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
TOML
# Pod network: a bridge per node with its own /24. Sandboxes reach nothing
# across nodes (the exec channel goes through the API server and kubelet).
cat >/etc/cni/net.d/10-lab.conflist <<JSON
{"cniVersion": "0.4.0", "name": "lab", "plugins": [
 {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.$I.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
 {"type": "loopback"}]}
JSON
containerd >/var/log/lab/containerd.log 2>&1 &
cat >/var/lib/kubelet/config.yaml <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$NAME
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: /lab/pki/ca.crt}
authorization: {mode: AlwaysAllow}
maxPods: $MAXPODS
podPidsLimit: 512
failSwapOn: false
resolvConf: ""
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
nodeLeaseDurationSeconds: 12
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "200Mi", nodefs.available: "2%", imagefs.available: "2%"}
kubeAPIQPS: 100
kubeAPIBurst: 200
# The lab's nodes hold images both loaded (ctr import) and pulled from the
# lab registry, the same image ids under two names. With the default
# (NeverVerifyPreloadedImages, KubeletEnsureSecretPulledImages beta since
# 1.35) an image the kubelet once pulled counts as not preloaded any more,
# and a pod naming its loaded name with imagePullPolicy Never then fails
# with ErrImageNeverPull. The lab has no pull credentials to protect.
imagePullCredentialsVerificationPolicy: NeverVerify
YAML
until [ -S /run/containerd/containerd.sock ]; do sleep 0.2; done
exec kubelet --config /var/lib/kubelet/config.yaml --kubeconfig /lab/$NAME.kubeconfig \
	--node-ip "$IP" --hostname-override "$NAME" >/var/log/lab/kubelet.log 2>&1
