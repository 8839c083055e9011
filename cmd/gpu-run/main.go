// Command gpu-run is `make run`: it brings up a local control plane (etcd and
// kube-apiserver built from the pinned modules) with a small GPU fleet, or
// uses the cluster in $KUBECONFIG, starts gpu-scheduler beside it with the
// shipped configuration, submits manifests/examples, and prints where each
// pod went, on which devices, and why the pending ones wait.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakedra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakekubelet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubeapply"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubectlgpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
)

func main() {
	bin := flag.String("bin", "bin", "directory with gpu-scheduler, etcd and kube-apiserver")
	kubeBin := flag.String("k8s-bin", "", "directory with the local control plane's etcd and kube-apiserver (default: -bin; make run K8S=1.35 gives bin/k8s-1.35)")
	keep := flag.Bool("keep", false, "keep everything running until Ctrl-C (prints the kubeconfig)")
	namespace := flag.String("namespace", "gpu-demo", "namespace for the example pods")
	timeout := flag.Duration("timeout", 2*time.Minute, "how long to wait for the examples to settle")
	flag.Parse()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if *kubeBin == "" {
		kubeBin = bin
	}
	if err := run(ctx, *bin, *kubeBin, *namespace, *keep, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "gpu-run:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}

func run(ctx context.Context, bin, kubeBin, namespace string, keep bool, timeout time.Duration) error {
	bin, _ = filepath.Abs(bin)
	kubeBin, _ = filepath.Abs(kubeBin)
	var cfg *rest.Config
	var schedKubeconfig, dir string
	if kc := os.Getenv("KUBECONFIG"); kc != "" {
		var err error
		if cfg, err = clientcmd.BuildConfigFromFlags("", kc); err != nil {
			return err
		}
		step("using the cluster in KUBECONFIG (%s)", cfg.Host)
		schedKubeconfig = kc
		if dir, err = os.MkdirTemp("", "gpu-run-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else {
		step("starting a local control plane (etcd, kube-apiserver from %s) on 127.0.0.1", kubeBin)
		start := time.Now()
		cp, err := localcp.Start(ctx, localcp.Options{BinDir: kubeBin})
		if err != nil {
			return err
		}
		defer cp.Stop()
		cfg, dir = cp.Config, cp.Dir
		step("control plane ready in %.1fs: %s", time.Since(start).Seconds(), cp.URL)
		a, err := kubeapply.New(cfg)
		if err != nil {
			return err
		}
		if _, err := a.Apply(ctx, manifests.RBAC, "kube-system", false); err != nil {
			return fmt.Errorf("applying manifests/rbac.yaml: %w", err)
		}
		if _, err := a.Apply(ctx, manifests.AdmissionPolicy, "", false); err != nil {
			return fmt.Errorf("applying manifests/admission-policy.yaml: %w", err)
		}
		step("applied manifests/rbac.yaml and admission-policy.yaml; gpu-scheduler runs as its ServiceAccount, with that RBAC only")
		if schedKubeconfig, err = cp.WriteKubeconfig(localcp.UserGPUScheduler, filepath.Join(dir, "gpu-scheduler.kubeconfig")); err != nil {
			return err
		}
		client := kubernetes.NewForConfigOrDie(cfg)
		if err := fleet.Create(ctx, client, fleet.Demo()...); err != nil {
			return err
		}
		if err := fakedra.InstallClasses(ctx, client); err != nil {
			return err
		}
		hamiNodes, draNodes := 0, 0
		for _, n := range fleet.Demo() {
			if n.HAMiSplit > 0 {
				hamiNodes++
			}
			if n.DRA != "" {
				draNodes++
			}
		}
		step("registered %d fake nodes with GFD labels, %d of them running HAMi's device plugin (fake: it registers the GPUs by UUID and hands each container the devices and limits chosen), %d publishing their GPUs through a fake DRA driver (ResourceSlices as NVIDIA's and HAMi's drivers publish them, and their DeviceClasses); a fake kubelet keeps them Ready", len(fleet.Demo()), hamiNodes, draNodes)
		k := fakekubelet.New(client)
		k.HeartbeatPeriod = 0 // no controller-manager here reads node leases
		go k.Run(ctx)
		if keep {
			fmt.Printf("    kubeconfig: %s\n", cp.Kubeconfig)
		}
	}
	client := kubernetes.NewForConfigOrDie(cfg)

	args := []string{"--v=2"}
	gangs := servesPodGroups(client)
	if gangs {
		// Gangs: the cluster serves the Workload API (the local control
		// plane does); a scheduler with the gate on a cluster that does not
		// would wait for it forever.
		args = append(args, "--feature-gates=GenericWorkload=true")
		step("the cluster serves PodGroups (scheduling.k8s.io/v1beta1): gpu-scheduler runs with GenericWorkload on (gangs)")
	}
	sched, err := localcp.StartScheduler(ctx, localcp.SchedulerOptions{
		Name: "gpu-scheduler", Binary: filepath.Join(bin, "gpu-scheduler"), Config: manifests.SchedulerConfig,
		Kubeconfig: schedKubeconfig, Dir: dir, Args: args,
	})
	if err != nil {
		return err
	}
	defer sched.Stop(10 * time.Second)
	if err := sched.WaitHealthy(ctx, time.Minute); err != nil {
		return err
	}
	step("gpu-scheduler is up (pid %d, https://127.0.0.1:%d, log %s)", sched.Pid(), sched.Port, sched.LogPath)
	if err := waitLeader(ctx, client); err != nil {
		return fmt.Errorf("%w\n%s", err, sched.Tail(3000))
	}

	if err := submit(ctx, client, cfg, namespace, gangs); err != nil {
		return err
	}
	pods, err := settle(ctx, client, namespace, timeout)
	if err != nil {
		return err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claimed, err := draView(ctx, client, namespace)
	if err != nil {
		return err
	}
	printTable(pods, nodes.Items, claimed)
	if err := printDRA(ctx, client, claimed); err != nil {
		return err
	}
	if err := operatorViews(ctx, client); err != nil {
		return err
	}
	if keep {
		step("everything keeps running; Ctrl-C stops it")
		<-ctx.Done()
	}
	return nil
}

// operatorViews prints what `kubectl gpu nodes` and `kubectl gpu frag`
// print on this cluster (the same code).
func operatorViews(ctx context.Context, client kubernetes.Interface) error {
	o := &kubectlgpu.Options{Client: client, Out: os.Stdout, SchedulerName: gpu.SchedulerName}
	step("kubectl gpu nodes: what each GPU holds, as the scheduler counts it")
	nodes, err := o.Nodes(ctx)
	if err != nil {
		return err
	}
	if err := o.PrintNodes(nodes); err != nil {
		return err
	}
	fmt.Println()
	step("kubectl gpu frag: the idle GPU the typical pods could not use, and how many more would fit")
	frag, err := o.Frag(ctx)
	if err != nil {
		return err
	}
	if err := o.PrintFrag(frag); err != nil {
		return err
	}
	fmt.Println()
	return nil
}

func waitLeader(ctx context.Context, client kubernetes.Interface) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		l, err := client.CoordinationV1().Leases("kube-system").Get(ctx, "gpu-scheduler", metav1.GetOptions{})
		if err == nil && ptr.Deref(l.Spec.HolderIdentity, "") != "" {
			step("leader: %s (lease kube-system/gpu-scheduler)", *l.Spec.HolderIdentity)
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("no gpu-scheduler leader after a minute")
}

func submit(ctx context.Context, client kubernetes.Interface, cfg *rest.Config, namespace string, gangs bool) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	a, err := kubeapply.New(cfg)
	if err != nil {
		return err
	}
	var names, skipped []string
	for _, ex := range manifests.Examples() {
		objs, err := kubeapply.Decode(ex.YAML)
		if err != nil {
			return fmt.Errorf("examples/%s.yaml: %w", ex.Name, err)
		}
		if !gangs && slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "PodGroup" }) {
			skipped = append(skipped, ex.Name)
			continue
		}
		if slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "ResourceClaim" }) && !hasDeviceClass(ctx, client, fakedra.DriverName(fakedra.HAMi)) {
			skipped = append(skipped, ex.Name)
			continue
		}
		// Fresh objects each run: a pod's spec cannot change once scheduled.
		for _, o := range objs {
			if err := remove(ctx, client, namespace, o); err != nil {
				return fmt.Errorf("examples/%s.yaml: %w", ex.Name, err)
			}
		}
		if _, err := a.Apply(ctx, ex.YAML, namespace, false); err != nil {
			return fmt.Errorf("examples/%s.yaml: %w", ex.Name, err)
		}
		names = append(names, ex.Name)
	}
	step("submitted manifests/examples into namespace %s: %s", namespace, strings.Join(names, ", "))
	if len(skipped) > 0 {
		step("skipped (the cluster does not serve PodGroups): %s", strings.Join(skipped, ", "))
	}
	return nil
}

// remove deletes an example's pod or PodGroup and waits until it is gone.
func remove(ctx context.Context, client kubernetes.Interface, namespace string, o *unstructured.Unstructured) error {
	var del func() error
	var get func() error
	switch o.GetKind() {
	case "Pod":
		del = func() error {
			return client.CoreV1().Pods(namespace).Delete(ctx, o.GetName(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}
		get = func() error {
			_, err := client.CoreV1().Pods(namespace).Get(ctx, o.GetName(), metav1.GetOptions{})
			return err
		}
	case "ResourceClaim":
		del = func() error {
			return client.ResourceV1().ResourceClaims(namespace).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
		}
		get = func() error {
			_, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, o.GetName(), metav1.GetOptions{})
			return err
		}
	case "PodGroup":
		del = func() error {
			return client.SchedulingV1beta1().PodGroups(namespace).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
		}
		get = func() error {
			_, err := client.SchedulingV1beta1().PodGroups(namespace).Get(ctx, o.GetName(), metav1.GetOptions{})
			return err
		}
	default:
		return nil
	}
	if err := del(); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	for {
		if err := get(); apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// hasDeviceClass reports whether the cluster has the DeviceClass.
func hasDeviceClass(ctx context.Context, client kubernetes.Interface, name string) bool {
	_, err := client.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
	return err == nil
}

// servesPodGroups reports whether the cluster serves the PodGroup API.
func servesPodGroups(client kubernetes.Interface) bool {
	rl, err := client.Discovery().ServerResourcesForGroupVersion("scheduling.k8s.io/v1beta1")
	if err != nil {
		return false
	}
	return slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == "podgroups" })
}

// settle waits until every example is bound or marked unschedulable.
func settle(ctx context.Context, client kubernetes.Interface, namespace string, timeout time.Duration) ([]v1.Pod, error) {
	deadline := time.Now().Add(timeout)
	for {
		list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		done := 0
		for _, p := range list.Items {
			if p.Spec.NodeName != "" || unschedulable(&p) != "" {
				done++
			}
		}
		if done == len(list.Items) || time.Now().After(deadline) {
			sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
			return list.Items, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func unschedulable(p *v1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

func printTable(pods []v1.Pod, nodes []v1.Node, claimed *claimView) {
	models := map[string]string{}
	for _, n := range nodes {
		models[n.Name] = n.Labels[gpu.LabelGPUProduct]
	}
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "POD\tREQUEST\tNODE\tMODEL\tDEVICES\tDELIVERED (HAMi: UUID, memory and SM limit)\tSTATUS")
	for i := range pods {
		p := &pods[i]
		node, model, devices := "-", "-", "-"
		status := string(p.Status.Phase)
		if p.Spec.NodeName != "" {
			node = p.Spec.NodeName
			if m := models[node]; m != "" {
				model = m
			}
			if a, err := gpu.ParseAssignment(p.Annotations[gpu.AnnotationAssignment]); err == nil {
				var parts []string
				for _, s := range a.Shares {
					if s.Milli == gpu.MilliPerGPU {
						parts = append(parts, fmt.Sprintf("gpu%d", s.Index))
					} else {
						parts = append(parts, fmt.Sprintf("gpu%d:%dm", s.Index, s.Milli))
					}
				}
				devices = strings.Join(parts, ",")
			}
			if d := claimed.byPod[p.Name]; d != "" {
				devices = d
			}
		} else if msg := unschedulable(p); msg != "" {
			status = "Pending: " + msg
		}
		request := kubectlgpu.Describe(p, gpu.RequestOptions{ResourceNames: []v1.ResourceName{gpu.ResourceNvidiaGPU}, Agent: hami.Agent{}})
		if len(p.Spec.ResourceClaims) > 0 {
			request = "DRA claim"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, request, node, model, devices, delivered(p), status)
	}
	w.Flush()
	fmt.Println()
}

// delivered is what HAMi's device plugin was told to enforce for the pod
// (its allocated list), with the handshake's outcome.
func delivered(p *v1.Pod) string {
	v, ok := p.Annotations[hami.AnnotationAllocated]
	if !ok {
		return "-"
	}
	pd, err := hami.DecodePodDevices(v)
	if err != nil {
		return "unreadable"
	}
	var parts []string
	for _, cd := range pd {
		for _, d := range cd {
			limit := fmt.Sprintf("%d%% SM", d.Usedcores)
			if d.Usedcores == 0 || d.Usedcores >= 100 {
				limit = "SM unthrottled"
			}
			parts = append(parts, fmt.Sprintf("%s %dMiB %s", d.UUID, d.Usedmem, limit))
		}
	}
	return strings.Join(parts, ", ") + " [" + p.Annotations[hami.AnnotationBindPhase] + "]"
}

// claimView is what the DRA claims of the examples hold: by pod, and by
// device (driver/pool/device).
type claimView struct {
	byPod    map[string]string
	byDevice map[string][]string
}

// draView reads the examples' allocated claims.
func draView(ctx context.Context, client kubernetes.Interface, namespace string) (*claimView, error) {
	v := &claimView{byPod: map[string]string{}, byDevice: map[string][]string{}}
	list, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return v, nil // no DRA here
		}
		return nil, err
	}
	for _, c := range list.Items {
		a := c.Status.Allocation
		if a == nil {
			continue
		}
		var devs []string
		for _, r := range a.Devices.Results {
			d := "dra:" + r.Device
			if q, ok := r.ConsumedCapacity["cores"]; ok {
				d += fmt.Sprintf(" (%s%% SM", q.String())
				if m, ok := r.ConsumedCapacity["memory"]; ok {
					d += ", " + m.String()
				}
				d += ")"
			}
			devs = append(devs, d)
			k := r.Driver + "/" + r.Pool + "/" + r.Device
			v.byDevice[k] = append(v.byDevice[k], c.Name)
		}
		for _, ref := range c.Status.ReservedFor {
			if ref.Resource == "pods" {
				v.byPod[ref.Name] = strings.Join(devs, ",")
			}
		}
	}
	return v, nil
}

// printDRA lists the GPUs the fake DRA drivers publish and the claims on
// each: the device each claim got is the one GPUDynamicResources showed
// the allocator first (the most used that fits).
func printDRA(ctx context.Context, client kubernetes.Interface, claimed *claimView) error {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	var rows []string
	for _, s := range list.Items {
		if s.Spec.Driver != fakedra.DriverName(fakedra.NVIDIA) && s.Spec.Driver != fakedra.DriverName(fakedra.HAMi) {
			continue
		}
		for _, d := range s.Spec.Devices {
			model := ""
			if a, ok := d.Attributes["productName"]; ok && a.StringValue != nil {
				model = *a.StringValue
			}
			shared := "whole"
			if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
				shared = "shared by capacity"
			}
			held := strings.Join(claimed.byDevice[s.Spec.Driver+"/"+s.Spec.Pool.Name+"/"+d.Name], ",")
			if held == "" {
				held = "-"
			}
			rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", ptr.Deref(s.Spec.NodeName, "-"), s.Spec.Driver, d.Name, model, shared, held))
		}
	}
	if len(rows) == 0 {
		return nil
	}
	sort.Strings(rows)
	step("DRA: the GPUs the fake drivers publish (ResourceSlices) and the claims on each; GPUDynamicResources shows DRA's allocator the most used GPU first, so shares go beside shares")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tDRIVER\tDEVICE\tMODEL\tKIND\tCLAIMS")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	w.Flush()
	fmt.Println()
	return nil
}
