package main

import (
	"errors"
	"fmt"

	_ "github.com/rollout-rl/rollout/sandbox/builtin"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
)

func init() { registerSandbox(newSandboxGCCmd) }

func newSandboxGCCmd() *cobra.Command {
	var opts sandbox.ReapOptions
	var kube, runc bool
	var kc k8sconfig.Config
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove orphaned sandbox containers (or pods) of this service",
		Long: "Remove containers labelled io.rollout.managed=true whose creating process on this host is gone\n" +
			"(crashed runs). Containers of running instances are kept unless --all is given.\n" +
			"With --kubernetes: delete the owner leases of processes that stopped renewing them (the\n" +
			"cluster's garbage collector then deletes their pods) and pods without a live owner, in\n" +
			"--namespace (docs/kubernetes.md).\n" +
			"With --runc: remove the runc backend's containers whose creating process is gone, with\n" +
			"their writable layers, and the unpacked images the engine no longer has (as root).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if kube && runc {
				return usageError(cmd, errors.New("--kubernetes and --runc: choose one backend to collect"))
			}
			name, what := sandbox.BackendDocker, "container(s)"
			switch {
			case kube:
				name, what = sandbox.BackendKubernetes, "object(s)"
			case runc:
				name, what = sandbox.BackendRunc, "container(s) and unpacked image(s)"
			}
			reg, err := sandbox.Lookup(name)
			if err != nil {
				return err
			}
			removed, err := reg.GC(cmd.Context(), sandbox.OpenOptions{Config: kc}, opts)
			out := cmd.OutOrStdout()
			for _, r := range removed {
				switch {
				case r.Reason == "image": // runc: an unpacked image the engine no longer has
					fmt.Fprintf(out, "removed unpacked image %s\n", r.ID)
					continue
				case r.Name == "": // runc: the id is the name
					fmt.Fprintf(out, "removed %s (instance %s, %s)\n", r.ID, r.Instance, r.Reason)
					continue
				}
				fmt.Fprintf(out, "removed %s %s (instance %s, %s)\n", r.ID[:min(12, len(r.ID))], r.Name, r.Instance, r.Reason)
			}
			fmt.Fprintf(out, "%d %s removed\n", len(removed), what)
			return err
		},
	}
	cmd.Flags().BoolVar(&opts.All, "all", false, "remove every sandbox container of this service, also those of running instances")
	cmd.Flags().BoolVar(&opts.OtherHosts, "other-hosts", false, "also remove containers created from other hosts (shared engine)")
	cmd.Flags().BoolVar(&kube, "kubernetes", false, "collect on a Kubernetes cluster instead of the local engine")
	cmd.Flags().BoolVar(&runc, "runc", false, "collect the runc backend's containers (sandbox.backend runc) instead of the engine's")
	cmd.Flags().StringVar(&kc.Kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config, in-cluster)")
	cmd.Flags().StringVar(&kc.Context, "context", "", "kubeconfig context")
	cmd.Flags().StringVar(&kc.Namespace, "namespace", "default", "namespace of the sandbox pods")
	return cmd
}
