// Package kubernetes is the Kubernetes backend: one pod per sandbox (or, in
// mode agent-sandbox, one claimed from the kubernetes-sigs/agent-sandbox
// controller), the agent exec'd into it over one persistent stream. Its
// configuration block is the client-go-free package k8sconfig.
package kubernetes
