// Command kubectl-gpu is the `kubectl gpu` plugin: what each GPU holds
// (nodes), which GPU pods wait and why (pending), and how fragmented the
// idle GPU is against the workload that arrives (frag). Put it on PATH and
// run `kubectl gpu ...`; it takes kubectl's kubeconfig flags.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubectlgpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/version"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	o := &kubectlgpu.Options{Out: os.Stdout}
	var workload, configFile string
	var all bool
	root := &cobra.Command{
		Use:          "kubectl-gpu",
		Short:        "GPUs of the cluster as gpu-scheduler counts them",
		Version:      version.Version,
		SilenceUsage: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := flags.ToRESTConfig()
			if err != nil {
				return err
			}
			if o.Client, err = kubernetes.NewForConfig(cfg); err != nil {
				return err
			}
			if !all && flags.Namespace != nil && *flags.Namespace != "" {
				o.Namespace = *flags.Namespace
			}
			if workload != "" {
				if o.Workload, err = kubectlgpu.ReadWorkload(workload); err != nil {
					return err
				}
			}
			if configFile != "" {
				if o.Config, err = os.ReadFile(configFile); err != nil {
					return err
				}
			}
			return nil
		},
	}
	flags.AddFlags(root.PersistentFlags())
	// Ours, before cobra merges the process-wide flags: component-base's
	// --version (linked in with the scheduler's plugins) is not a bool, and
	// cobra's version flag would then fail.
	root.Flags().Bool("version", false, "print kubectl-gpu's version")
	root.PersistentFlags().StringVarP(&o.Output, "output", "o", "", "output format: json or yaml (default: a table)")
	root.PersistentFlags().StringVarP(&o.Selector, "selector", "l", "", "only the nodes with these labels")
	root.PersistentFlags().BoolVarP(&all, "all-namespaces", "A", false, "pods of every namespace (the default unless -n is given)")
	root.PersistentFlags().StringVar(&o.SchedulerName, "scheduler-name", "", "the scheduler profile whose accounting, target workload and pods are shown (default: the configuration's only profile, else gpu-scheduler)")
	root.PersistentFlags().StringVar(&configFile, "config", "", "a KubeSchedulerConfiguration to read the profile from (default: the deployed one, --config-map, else the shipped one)")
	root.PersistentFlags().StringVar(&o.ConfigMap, "config-map", "", "the deployed configuration's ConfigMap, namespace/name (default kube-system/gpu-scheduler-config; a release of the chart elsewhere: <namespace>/<release>-config)")
	run := func(f func(context.Context) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error { return f(cmd.Context()) }
	}
	root.AddCommand(&cobra.Command{
		Use:   "nodes",
		Short: "Per node and GPU: model, UUID, what is allocated (a bar), the pods on it, health; totals",
		Args:  cobra.NoArgs,
		RunE: run(func(ctx context.Context) error {
			r, err := o.Nodes(ctx)
			if err != nil {
				return err
			}
			return o.PrintNodes(r)
		}),
	})
	pending := &cobra.Command{
		Use:   "pending",
		Short: "GPU pods that wait, with their request and the scheduler's explanation",
		Args:  cobra.NoArgs,
		RunE: run(func(ctx context.Context) error {
			ps, err := o.Pending(ctx)
			if err != nil {
				return err
			}
			return o.PrintPending(ps)
		}),
	}
	root.AddCommand(pending)
	frag := &cobra.Command{
		Use:   "frag",
		Short: "Per node and cluster-wide: idle GPU, the part of it no typical pod can use, how many more of each typical pod would fit",
		Args:  cobra.NoArgs,
		RunE: run(func(ctx context.Context) error {
			r, err := o.Frag(ctx)
			if err != nil {
				return err
			}
			return o.PrintFrag(r)
		}),
	}
	frag.Flags().StringVar(&workload, "workload", "", "a YAML list of tasks (cpuMilli, memoryMiB, gpuMilli, gpuCount, models, weight) to measure against; default: learned from the cluster's GPU pods")
	root.AddCommand(frag)
	var podsFile string
	var wopts kubectlgpu.WhatIfOptions
	whatif := &cobra.Command{
		Use:   "whatif -f pods.yaml",
		Short: "Where the given pods would go on the cluster as it is now, through the scheduler's framework profile; nothing is written",
		Args:  cobra.NoArgs,
		RunE: run(func(ctx context.Context) error {
			var err error
			if wopts.Pods, err = os.ReadFile(podsFile); err != nil {
				return err
			}
			ps, from, err := o.WhatIf(ctx, wopts)
			if err != nil {
				return err
			}
			return o.PrintWhatIf(ps, from)
		}),
	}
	whatif.Flags().StringVarP(&podsFile, "filename", "f", "", "the pods to place, in order (YAML, several documents)")
	whatif.Flags().StringVar(&wopts.Policy, "policy", "", "GPUScore's policy instead of the configured one: Fragmentation, BestFit, Packing or Spread")
	_ = whatif.MarkFlagRequired("filename")
	root.AddCommand(whatif)
	root.SetVersionTemplate(fmt.Sprintf("kubectl-gpu %s\n", version.Version))
	return root
}
