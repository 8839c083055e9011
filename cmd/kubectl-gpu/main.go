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
	"k8s.io/cli-runtime/pkg/resource"
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
	// kubectl's printers: json, yaml, jsonpath, go-template (and their
	// -file forms); a table, wide and name are ours.
	printFlags := genericclioptions.NewPrintFlags("")
	printFlags.OutputFormat = &o.Output
	template := printFlags.TemplatePrinterFlags.TemplateArgument
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
			// The context's namespace, as kubectl's, unless -A.
			if !all {
				if o.Namespace, _, err = flags.ToRawKubeConfigLoader().Namespace(); err != nil {
					return err
				}
			}
			switch {
			// --template alone means go-template, as in kubectl; with
			// -o wide or name it is ignored, as in kubectl.
			case o.Output == "wide" || o.Output == "name" || (o.Output == "" && *template == ""):
			default:
				if o.Printer, err = printFlags.ToPrinter(); err != nil {
					return fmt.Errorf("%w (or wide: a table with more columns)", err)
				}
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
	root.PersistentFlags().StringVarP(&o.Output, "output", "o", "", "output format: json, yaml, name, wide, jsonpath=..., jsonpath-file=..., go-template=..., go-template-file=... (default: a table)")
	root.PersistentFlags().StringVar(template, "template", "", "the template for -o go-template|jsonpath (or -o go-template=TEMPLATE)")
	printFlags.OutputFlagSpecified = func() bool { return root.PersistentFlags().Changed("output") }
	root.PersistentFlags().BoolVar(&o.NoHeaders, "no-headers", false, "tables without their headers (and the lines before them)")
	root.PersistentFlags().StringVarP(&o.Selector, "selector", "l", "", "only the nodes with these labels")
	root.PersistentFlags().BoolVarP(&all, "all-namespaces", "A", false, "the pending pods of every namespace (default: the context's namespace, or -n)")
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
	var files resource.FilenameOptions
	var wopts kubectlgpu.WhatIfOptions
	whatif := &cobra.Command{
		Use:   "whatif -f pods.yaml",
		Short: "Where the given pods would go on the cluster as it is now, through the scheduler's framework profile; nothing is written",
		Args:  cobra.NoArgs,
		RunE: run(func(ctx context.Context) error {
			if err := files.RequireFilenameOrKustomize(); err != nil {
				return err
			}
			ns, explicit, err := flags.ToRawKubeConfigLoader().Namespace()
			if err != nil {
				return err
			}
			// As kubectl apply reads them: files, directories (-R), URLs and
			// stdin (-f -); without a namespace, the context's or -n; a pod
			// of another namespace than an -n given is refused.
			infos, err := resource.NewBuilder(flags).Unstructured().
				NamespaceParam(ns).DefaultNamespace().
				FilenameParam(explicit, &files).Flatten().Do().Infos()
			if err != nil {
				return err
			}
			if wopts.Pods, err = kubectlgpu.PodsOf(infos); err != nil {
				return err
			}
			r, err := o.WhatIf(ctx, wopts)
			if err != nil {
				return err
			}
			return o.PrintWhatIf(r)
		}),
	}
	whatif.Flags().StringSliceVarP(&files.Filenames, "filename", "f", nil, "the pods to place, in order: files, directories, URLs, or - for stdin (YAML or JSON, several documents)")
	whatif.Flags().BoolVarP(&files.Recursive, "recursive", "R", false, "read the directories given with -f recursively")
	whatif.Flags().StringVar(&wopts.Policy, "policy", "", "GPUScore's policy instead of the configured one: Fragmentation, BestFit, Packing or Spread")
	_ = whatif.MarkFlagRequired("filename")
	root.AddCommand(whatif)
	root.SetVersionTemplate(fmt.Sprintf("kubectl-gpu %s\n", version.Version))
	return root
}
