// Package harness is shared by the integration and e2e suites: a cluster
// (the local control plane, or one from a kubeconfig), test scopes with their
// own namespace and fake nodes, pod builders, waits, and the device-accounting
// check that no GPU is ever booked beyond its capacity.
package harness

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
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
	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
)

// RepoRoot finds the repository (where go.mod is).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BinDir is where make puts the binaries (override with GPU_SCHEDULER_BIN).
func BinDir() string {
	if d := os.Getenv("GPU_SCHEDULER_BIN"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin")
}

// KubeBinDir holds the local control plane's etcd and kube-apiserver, and
// the vanilla kube-scheduler and kube-controller-manager of the same minor
// (make e2e K8S=1.35 sets GPU_SCHEDULER_K8S_BIN): BinDir for the newest.
func KubeBinDir() string {
	if d := os.Getenv("GPU_SCHEDULER_K8S_BIN"); d != "" {
		return d
	}
	return BinDir()
}

// Minor is the local control plane's Kubernetes minor (0 for a cluster
// given by kubeconfig).
func (c *Cluster) Minor() int {
	if c.CP == nil {
		return 0
	}
	return c.CP.Minor
}

// Cluster is what the tests run against.
type Cluster struct {
	Client kubernetes.Interface
	Config *rest.Config
	// CP is the local control plane, nil for an external cluster.
	CP *localcp.ControlPlane
	// Dir holds logs and generated files.
	Dir string
	// Kubeconfig of the admin user.
	Kubeconfig string
	stop       func()
}

// Local reports whether the cluster is our local control plane.
func (c *Cluster) Local() bool { return c.CP != nil }

// Setup starts the local control plane, or uses the cluster in kubeconfig if
// one is given. RBAC from manifests/ is applied locally, and the fake kubelet
// runs in-process for fake nodes either way.
func Setup(ctx context.Context, kubeconfig string) (*Cluster, error) {
	c := &Cluster{}
	ctx, cancel := context.WithCancel(ctx)
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			cancel()
			return nil, err
		}
		cfg.QPS, cfg.Burst = 500, 1000
		c.Config, c.Kubeconfig = cfg, kubeconfig
		if c.Dir, err = os.MkdirTemp("", "gpu-e2e-"); err != nil {
			cancel()
			return nil, err
		}
	} else {
		cp, err := localcp.Start(ctx, localcp.Options{BinDir: KubeBinDir()})
		if err != nil {
			cancel()
			return nil, err
		}
		c.CP, c.Config, c.Dir, c.Kubeconfig = cp, cp.Config, cp.Dir, cp.Kubeconfig
		a, err := kubeapply.New(cp.Config)
		if err == nil {
			_, err = a.Apply(ctx, manifests.RBAC, "kube-system", false)
		}
		if err != nil {
			cancel()
			cp.Stop()
			return nil, fmt.Errorf("applying RBAC: %w", err)
		}
	}
	// The harness's clients speak JSON. Protobuf was tried (2f318de) and
	// bound the churn benchmark's stream no faster (docs/benchmarks.md §5).
	var err error
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		cancel()
		return nil, err
	}
	k := fakekubelet.New(c.Client)
	if c.Local() {
		// No controller-manager runs locally, so nothing reads node leases;
		// at 5,000 nodes renewing them would take the control plane's CPU
		// from the scheduler under test, which never sees them.
		k.HeartbeatPeriod = 0
	}
	go k.Run(ctx)
	c.stop = func() {
		cancel()
		if c.CP != nil {
			c.CP.Stop()
		}
	}
	return c, nil
}

// ApplyAdmissionPolicy applies manifests/admission-policy.yaml (locally;
// a deployed cluster has it from manifests/) and waits until the API server
// enforces it: the admission plugin loads policies asynchronously.
func (c *Cluster) ApplyAdmissionPolicy(ctx context.Context) error {
	if c.Local() {
		a, err := kubeapply.New(c.Config)
		if err != nil {
			return err
		}
		if _, err := a.Apply(ctx, manifests.AdmissionPolicy, "", false); err != nil {
			return fmt.Errorf("applying the admission policy: %w", err)
		}
	}
	probe := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "policy-probe-", Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{gpu.AnnotationAssignment: "nowhere:0=1000"}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = c.Client.CoreV1().Pods(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(last) || apierrors.IsInvalid(last), nil
	})
	if err != nil {
		return fmt.Errorf("the admission policy is not enforced (a forged assignment was accepted: %v)", last)
	}
	// And it lets an ordinary GPU pod through.
	ok := probe.DeepCopy()
	ok.Annotations = map[string]string{gpu.AnnotationMilli: "300"}
	if _, err := c.Client.CoreV1().Pods(ok.Namespace).Create(ctx, ok, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		return fmt.Errorf("the admission policy refuses an ordinary GPU pod: %w", err)
	}
	return nil
}

// Teardown stops what Setup started.
func (c *Cluster) Teardown() {
	if c.stop != nil {
		c.stop()
	}
}

// Scope is one test's namespace and nodes, removed when the test ends. Its
// nodes carry a label that its pods select, so tests never share nodes.
type Scope struct {
	T       testing.TB
	C       *Cluster
	Ctx     context.Context
	NS      string
	ID      string
	nodes   []string
	cleanup bool
}

// LabelScope selects a scope's nodes.
const LabelScope = "gpu-scheduler.io/e2e-scope"

// NewScope creates a namespace for the test.
func (c *Cluster) NewScope(t testing.TB) *Scope {
	t.Helper()
	id := fmt.Sprintf("%s-%04d", strings.ToLower(sanitize(t.Name())), rand.Intn(10000))
	if len(id) > 40 {
		id = id[len(id)-40:]
		id = strings.TrimLeft(id, "-")
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Scope{T: t, C: c, Ctx: ctx, NS: "e2e-" + id, ID: id, cleanup: true}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.NS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer cancel()
		bg := context.Background()
		// Pods first, at once, so that nothing waits for a kubelet.
		c.Client.CoreV1().Pods(s.NS).DeleteCollection(bg, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		c.Client.CoreV1().Namespaces().Delete(bg, s.NS, metav1.DeleteOptions{})
		for _, n := range s.nodes {
			c.Client.CoreV1().Nodes().Delete(bg, n, metav1.DeleteOptions{})
			fakedra.Unpublish(bg, c.Client, n) // no garbage collector here
		}
	})
	return s
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-")
}

// Node is the name a scope gives a node: prefixed with its ID.
func (s *Scope) Node(name string) string { return s.ID + "-" + name }

// AddNodes registers fake nodes for this scope.
func (s *Scope) AddNodes(nodes ...fleet.Node) {
	s.T.Helper()
	for i := range nodes {
		nodes[i].Name = s.Node(nodes[i].Name)
		if nodes[i].Labels == nil {
			nodes[i].Labels = map[string]string{}
		}
		nodes[i].Labels[LabelScope] = s.ID
		s.nodes = append(s.nodes, nodes[i].Name)
	}
	if err := fleet.Create(s.Ctx, s.C.Client, nodes...); err != nil {
		s.T.Fatal(err)
	}
}

// NodeNames lists the scope's nodes.
func (s *Scope) NodeNames() []string { return s.nodes }

// PodSpec describes a test pod. Scheduler defaults to gpu-scheduler; set it
// to "-" for the default scheduler (no schedulerName).
type PodSpec struct {
	Name         string
	Scheduler    string
	GPUs         int
	Milli        int
	Model        string
	CPU          string
	Memory       string
	Annotations  map[string]string
	NodeSelector map[string]string
	Tolerations  []v1.Toleration
	// PriorityClass names the pod's PriorityClass.
	PriorityClass string
	// PodGroup names the pod's PodGroup (a gang).
	PodGroup   string
	Finalizers []string
	Labels     map[string]string
	// AnyNode lets the pod go beyond the scope's nodes.
	AnyNode bool
}

// Pod builds a pod in the scope's namespace, restricted to its nodes.
func (s *Scope) Pod(p PodSpec) *v1.Pod {
	cpu, mem := p.CPU, p.Memory
	if cpu == "" {
		cpu = "100m"
	}
	if mem == "" {
		mem = "128Mi"
	}
	c := v1.Container{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(mem)},
	}}
	if p.GPUs > 0 {
		q := *resource.NewQuantity(int64(p.GPUs), resource.DecimalSI)
		c.Resources.Limits = v1.ResourceList{gpu.ResourceNvidiaGPU: q}
		c.Resources.Requests[gpu.ResourceNvidiaGPU] = q
	}
	ann := map[string]string{}
	for k, v := range p.Annotations {
		ann[k] = v
	}
	if p.Milli > 0 {
		ann[gpu.AnnotationMilli] = fmt.Sprint(p.Milli)
	}
	if p.Model != "" {
		ann[gpu.AnnotationModel] = p.Model
	}
	sel := map[string]string{}
	for k, v := range p.NodeSelector {
		sel[k] = v
	}
	if !p.AnyNode {
		sel[LabelScope] = s.ID
	}
	sched := p.Scheduler
	switch sched {
	case "":
		sched = gpu.SchedulerName
	case "-":
		sched = ""
	}
	var group *v1.PodSchedulingGroup
	if p.PodGroup != "" {
		group = &v1.PodSchedulingGroup{PodGroupName: ptr.To(p.PodGroup)}
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: s.NS, Annotations: ann, Labels: p.Labels, Finalizers: p.Finalizers},
		Spec: v1.PodSpec{
			SchedulerName: sched, Containers: []v1.Container{c}, NodeSelector: sel, Tolerations: p.Tolerations,
			PriorityClassName:             p.PriorityClass,
			SchedulingGroup:               group,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

// Create creates pods.
func (s *Scope) Create(pods ...*v1.Pod) {
	s.T.Helper()
	for _, p := range pods {
		if _, err := s.C.Client.CoreV1().Pods(p.Namespace).Create(s.Ctx, p, metav1.CreateOptions{}); err != nil {
			s.T.Fatalf("creating pod %s: %v", p.Name, err)
		}
	}
}

// Delete deletes a pod at once.
func (s *Scope) Delete(name string) {
	s.T.Helper()
	if err := s.C.Client.CoreV1().Pods(s.NS).Delete(s.Ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		s.T.Fatal(err)
	}
}

// Get returns a pod.
func (s *Scope) Get(name string) *v1.Pod {
	s.T.Helper()
	p, err := s.C.Client.CoreV1().Pods(s.NS).Get(s.Ctx, name, metav1.GetOptions{})
	if err != nil {
		s.T.Fatal(err)
	}
	return p
}

// WaitBound waits until the pods have a node.
func (s *Scope) WaitBound(timeout time.Duration, names ...string) map[string]*v1.Pod {
	s.T.Helper()
	out := map[string]*v1.Pod{}
	err := wait.PollUntilContextTimeout(s.Ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			if _, ok := out[n]; ok {
				continue
			}
			p, err := s.C.Client.CoreV1().Pods(s.NS).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Spec.NodeName == "" {
				return false, nil
			}
			out[n] = p
		}
		return true, nil
	})
	if err != nil {
		var missing []string
		for _, n := range names {
			if _, ok := out[n]; !ok {
				missing = append(missing, n+" ("+Unschedulable(s.GetOrNil(n))+")")
			}
		}
		s.T.Fatalf("pods not bound within %v: %s", timeout, strings.Join(missing, ", "))
	}
	return out
}

// GetOrNil returns a pod, or nil if it cannot be read (gone).
func (s *Scope) GetOrNil(name string) *v1.Pod {
	p, err := s.C.Client.CoreV1().Pods(s.NS).Get(s.Ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return p
}

// Unschedulable is the PodScheduled=False message of a pod, or "".
func Unschedulable(p *v1.Pod) string {
	if p == nil {
		return ""
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return c.Message
		}
	}
	return ""
}

// WaitUnschedulable waits until the pod is marked unschedulable and returns
// the message.
func (s *Scope) WaitUnschedulable(timeout time.Duration, name string) string {
	s.T.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(s.Ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := s.C.Client.CoreV1().Pods(s.NS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was bound to %s", name, p.Spec.NodeName)
		}
		msg = Unschedulable(p)
		return msg != "", nil
	})
	if err != nil {
		s.T.Fatalf("pod %s not marked unschedulable: %v", name, err)
	}
	return msg
}

// WaitReason waits until the pod, unbound, explains that it waits for a
// reason containing want: in its PodScheduled condition (the scheduler's last
// cycle) or in gpu-scheduler's PendingReason condition (kept current by its
// reconciler, also when no new cycle runs).
func (s *Scope) WaitReason(timeout time.Duration, name, want string) string {
	s.T.Helper()
	var got []string
	err := wait.PollUntilContextTimeout(s.Ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := s.C.Client.CoreV1().Pods(s.NS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was bound to %s", name, p.Spec.NodeName)
		}
		got = got[:0]
		for _, c := range p.Status.Conditions {
			if (c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse) || c.Type == gpu.ConditionPending {
				got = append(got, c.Message)
				if strings.Contains(c.Message, want) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		s.T.Fatalf("pod %s does not wait for %q: %v; its reasons: %q", name, want, err, got)
	}
	return strings.Join(got, " | ")
}

// Events returns the messages of a pod's events with the given reason (core
// and events.k8s.io events both land in core/v1 Events).
func (s *Scope) Events(name, reason string) []string {
	list, err := s.C.Client.CoreV1().Events(s.NS).List(s.Ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String()})
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Message)
	}
	return out
}

// WaitEvent waits for an event of the pod whose message contains want.
func (s *Scope) WaitEvent(timeout time.Duration, name, reason, want string) string {
	s.T.Helper()
	var got []string
	err := wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		got = s.Events(name, reason)
		for _, m := range got {
			if strings.Contains(m, want) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		s.T.Fatalf("no %s event for %s containing %q; events: %q", reason, name, want, got)
	}
	for _, m := range got {
		if strings.Contains(m, want) {
			return m
		}
	}
	return ""
}

// DeviceUse is a node's per-device booked milli, from the assignments of the
// pods bound to it.
type DeviceUse map[string]map[int]int32

// CheckDevices reads every pod in the cluster and checks the accounting
// invariant from the pods' requests, whoever placed them: on every node, the
// GPU pods bound there fit its healthy devices. Pods placed by gpu-scheduler
// must carry an assignment that names their node and agrees with their
// request (device count, milli per device, devices below allocatable); no
// device holds more than 1000 milli of them; and the pods without an
// assignment (other schedulers') fit in what is left, by count and by total.
// Nodes in allowed are known to be overcommitted by another binder and are
// not held to the invariant. It returns the per-device use of assignments.
func CheckDevices(ctx context.Context, client kubernetes.Interface, allowed ...string) (DeviceUse, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	type nodeInfo struct {
		alloc  int64
		memMiB int64
		// hami is the node's registration when HAMi's device plugin runs
		// there: its devices are checked by UUID in HAMi's dimensions.
		hami map[string]hami.Device
		used map[string]hami.Usage
		// whole and shares are what pods without an agreeing assignment hold.
		whole  int64
		shares []int64
	}
	info := map[string]*nodeInfo{}
	for _, n := range nodes.Items {
		q := n.Status.Allocatable[gpu.ResourceNvidiaGPU]
		mem, _ := strconv.ParseInt(n.Labels[gpu.LabelGPUMemory], 10, 64)
		info[n.Name] = &nodeInfo{alloc: q.Value(), memMiB: mem}
		if v, ok := n.Annotations[hami.AnnotationRegister]; ok {
			devs, _ := hami.ParseRegister(v)
			info[n.Name].hami, info[n.Name].used = map[string]hami.Device{}, map[string]hami.Usage{}
			for _, d := range devs {
				info[n.Name].hami[d.ID] = d
			}
		}
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	allow := map[string]bool{}
	for _, n := range allowed {
		allow[n] = true
	}
	use := DeviceUse{}
	var problems []string
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		ni := info[p.Spec.NodeName]
		if ni == nil {
			continue // its node is gone
		}
		name := p.Namespace + "/" + p.Name
		if ni.hami != nil {
			if problem := checkHAMiPod(&p, ni.hami, ni.used); problem != "" && !allow[p.Spec.NodeName] {
				problems = append(problems, name+": "+problem)
			}
			continue
		}
		req, err := gpu.ParseRequest(&p, gpu.DefaultRequestOptions)
		if err != nil {
			req = gpu.Request{Count: int32(gpu.WholeGPUs(&p, gpu.DefaultRequestOptions))}
		}
		if !req.HasGPU() {
			continue // an assignment on a CPU pod holds nothing
		}
		devices, milli := int64(req.Count), int64(gpu.MilliPerGPU)
		switch {
		case req.Milli > 0:
			devices, milli = 1, int64(req.Milli)
		case req.MemoryMiB > 0:
			devices = 1
			if ni.memMiB > 0 && req.MemoryMiB <= ni.memMiB {
				milli = (req.MemoryMiB*gpu.MilliPerGPU + ni.memMiB - 1) / ni.memMiB
			}
		}
		ours := strings.HasPrefix(p.Spec.SchedulerName, gpu.SchedulerName)
		a, aerr := gpu.ParseAssignment(p.Annotations[gpu.AnnotationAssignment])
		agrees := aerr == nil && a.Node == p.Spec.NodeName && int64(len(a.Shares)) == devices
		for _, sh := range a.Shares {
			agrees = agrees && int64(sh.Milli) == milli && int64(sh.Index) < ni.alloc
		}
		if !agrees {
			if ours && !allow[p.Spec.NodeName] {
				problems = append(problems, fmt.Sprintf("%s: placed by %s on %s for %dx%d milli, but its assignment %q does not agree",
					name, p.Spec.SchedulerName, p.Spec.NodeName, devices, milli, p.Annotations[gpu.AnnotationAssignment]))
			}
			if milli == gpu.MilliPerGPU {
				ni.whole += devices
			} else {
				ni.shares = append(ni.shares, milli)
			}
			continue
		}
		if use[a.Node] == nil {
			use[a.Node] = map[int]int32{}
		}
		for _, sh := range a.Shares {
			use[a.Node][sh.Index] += sh.Milli
		}
	}
	var names []string
	for n := range info {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ni := info[n]
		if ni.hami != nil {
			var over []string
			for id, u := range ni.used {
				d, ok := ni.hami[id]
				switch {
				case !ok:
					over = append(over, fmt.Sprintf("device %s is not registered", id))
				case u.Mem > int64(d.Devmem) || u.Cores > 100 || u.Slots > d.Count:
					over = append(over, fmt.Sprintf("device %s holds %d of %d MiB, %d%% of the SMs, %d of %d slots", id, u.Mem, d.Devmem, u.Cores, u.Slots, d.Count))
				}
			}
			if len(over) > 0 && !allow[n] {
				sort.Strings(over)
				problems = append(problems, n+": "+strings.Join(over, "; "))
			}
			continue
		}
		var free int64
		var rooms []int64 // partly used devices
		var over []string
		for d := int64(0); d < ni.alloc; d++ {
			m := int64(use[n][int(d)])
			if m > gpu.MilliPerGPU {
				over = append(over, fmt.Sprintf("device %d booked %d milli", d, m))
			}
			if m == 0 {
				free++
			} else if m < gpu.MilliPerGPU {
				rooms = append(rooms, gpu.MilliPerGPU-m)
			}
		}
		if ni.whole > free {
			over = append(over, fmt.Sprintf("%d whole GPUs of other binders but %d devices free", ni.whole, free))
		} else {
			for i := ni.whole; i < free; i++ {
				rooms = append(rooms, gpu.MilliPerGPU)
			}
			sort.Slice(ni.shares, func(i, j int) bool { return ni.shares[i] > ni.shares[j] })
			if !packs(ni.shares, rooms) {
				over = append(over, fmt.Sprintf("shares %v without an assignment do not fit the room left %v", ni.shares, rooms))
			}
		}
		if len(over) > 0 && !allow[n] {
			problems = append(problems, n+": "+strings.Join(over, "; "))
		}
	}
	if len(problems) > 0 {
		return use, fmt.Errorf("device accounting broken:\n%s", strings.Join(problems, "\n"))
	}
	return use, nil
}

// checkHAMiPod adds what a pod on a HAMi node holds, from its record
// (hami.io/vgpu-devices-allocated, HAMi's own accounting), to used, and says
// what is wrong with it: a GPU pod without a record, or a record that does
// not agree with the pod's request (device count, memory per device).
func checkHAMiPod(p *v1.Pod, devs map[string]hami.Device, used map[string]hami.Usage) string {
	opts := gpu.RequestOptions{ResourceNames: []v1.ResourceName{gpu.ResourceNvidiaGPU}, Agent: hami.Agent{}}
	req, err := gpu.ParseRequest(p, opts)
	if err != nil || !req.HasGPU() {
		return ""
	}
	rec, err := hami.DecodePodDevices(p.Annotations[hami.AnnotationAllocated])
	if err != nil || p.Annotations[hami.AnnotationVGPUNode] != p.Spec.NodeName {
		return fmt.Sprintf("a GPU pod on a HAMi node without a record for it (%q on %q): %v",
			p.Annotations[hami.AnnotationAllocated], p.Annotations[hami.AnnotationVGPUNode], err)
	}
	n, share := int(req.Count), gpu.Exclusive
	switch {
	case req.ShareCount > 0:
		n, share = int(req.ShareCount), req.Share
	case req.Milli > 0:
		n, share = 1, gpu.DeviceShare{Permille: req.Milli}
	case req.MemoryMiB > 0:
		n, share = 1, gpu.DeviceShare{MemoryMiB: req.MemoryMiB}
	}
	got := 0
	for _, ctr := range rec {
		for _, d := range ctr {
			got++
			reg, ok := devs[d.UUID]
			if !ok {
				return fmt.Sprintf("device %s is not the node's", d.UUID)
			}
			if want := share.MemoryOn(int64(reg.Devmem)); int64(d.Usedmem) != want {
				return fmt.Sprintf("device %s: %d MiB recorded, the request is %d MiB", d.UUID, d.Usedmem, want)
			}
		}
	}
	if got != n {
		return fmt.Sprintf("%d devices recorded, the request is for %d", got, n)
	}
	for id, u := range hami.PodUsage(p, rec) {
		t := used[id]
		t.Mem, t.Cores, t.Slots = t.Mem+u.Mem, t.Cores+u.Cores, t.Slots+u.Slots
		used[id] = t
	}
	return ""
}

// packs reports whether the shares fit the devices' rooms, each on one
// device: an exhaustive search, for the few shares a test has.
func packs(shares, rooms []int64) bool {
	if len(shares) == 0 {
		return true
	}
	for i := range rooms {
		if rooms[i] >= shares[0] {
			rooms[i] -= shares[0]
			ok := packs(shares[1:], rooms)
			rooms[i] += shares[0]
			if ok {
				return true
			}
		}
	}
	return false
}

// IgnoreNotFound is for cleanup paths.
func IgnoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// WithLimits adds container limits to a test pod (and the same requests, as
// the API server defaults them for extended resources).
func WithLimits(p *v1.Pod, limits map[v1.ResourceName]string) *v1.Pod {
	c := &p.Spec.Containers[0]
	if c.Resources.Limits == nil {
		c.Resources.Limits = v1.ResourceList{}
	}
	for k, v := range limits {
		c.Resources.Limits[k] = resource.MustParse(v)
		c.Resources.Requests[k] = resource.MustParse(v)
	}
	return p
}
