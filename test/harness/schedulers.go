package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	configv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	ourv1 "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/v1"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
)

// GPUSchedulers is the gpu-scheduler under test: local processes of the
// built binary, or the Deployment from manifests/ on a real cluster.
type GPUSchedulers interface {
	// Leader is the identity holding the gpu-scheduler lease.
	Leader(ctx context.Context) (string, error)
	// KillLeader kills the active instance without warning, and makes sure
	// a replacement is coming (a new process, or the Deployment's).
	KillLeader(ctx context.Context) error
	// AddStandby starts one more instance (process mode only).
	AddStandby(ctx context.Context) error
	// Active counts instances that report leading on /metrics, and Total
	// the instances running (process mode; -1 when unknown).
	Active(ctx context.Context) (active, total int)
	// Logs is the tail of the logs, for failures.
	Logs() string
	Stop()
}

// FastLeaderElection makes failover take seconds instead of the default 15 s
// lease, for tests.
func FastLeaderElection(c *configv1.KubeSchedulerConfiguration) {
	c.LeaderElection.LeaseDuration = metav1.Duration{Duration: 4 * time.Second}
	c.LeaderElection.RenewDeadline = metav1.Duration{Duration: 3 * time.Second}
	c.LeaderElection.RetryPeriod = metav1.Duration{Duration: 500 * time.Millisecond}
}

// AccountingOnlySharing turns on accountingOnlySharing, for the tests of
// the accounting with shares on nodes without a device agent.
func AccountingOnlySharing(c *configv1.KubeSchedulerConfiguration) {
	for i := range c.Profiles {
		for _, pc := range c.Profiles[i].PluginConfig {
			if a, ok := pc.Args.Object.(*ourv1.GPUFitArgs); ok {
				a.AccountingOnlySharing = ptr.To(true)
			}
		}
	}
}

// Processes runs the gpu-scheduler binary against a local control plane.
type Processes struct {
	C      *Cluster
	Binary string
	Config []byte
	Mutate func(*configv1.KubeSchedulerConfiguration)
	Args   []string
	mu     sync.Mutex
	procs  []*localcp.Scheduler
	n      int
}

// StartProcesses starts n instances of the binary as the gpu-scheduler
// ServiceAccount.
func StartProcesses(ctx context.Context, c *Cluster, n int, mutate func(*configv1.KubeSchedulerConfiguration), args ...string) (*Processes, error) {
	var nonEmpty []string
	for _, a := range args {
		if a != "" {
			nonEmpty = append(nonEmpty, a)
		}
	}
	p := &Processes{C: c, Binary: filepath.Join(BinDir(), "gpu-scheduler"), Config: manifests.SchedulerConfig, Mutate: mutate, Args: nonEmpty}
	for i := 0; i < n; i++ {
		if err := p.start(ctx); err != nil {
			p.Stop()
			return nil, err
		}
	}
	return p, nil
}

func (p *Processes) start(ctx context.Context) error {
	p.mu.Lock()
	p.n++
	name := fmt.Sprintf("gpu-scheduler-%d", p.n)
	p.mu.Unlock()
	kc, err := p.C.CP.WriteKubeconfig(localcp.UserGPUScheduler, filepath.Join(p.C.Dir, name+".kubeconfig"))
	if err != nil {
		return err
	}
	s, err := localcp.StartScheduler(ctx, localcp.SchedulerOptions{
		Name: name, Binary: p.Binary, Config: p.Config, Kubeconfig: kc, Dir: p.C.Dir,
		Mutate: p.Mutate, Args: append([]string{"--v=2"}, p.Args...),
	})
	if err != nil {
		return err
	}
	if err := s.WaitHealthy(ctx, time.Minute); err != nil {
		s.Kill()
		return err
	}
	s.Token = p.C.CP.Token(localcp.UserAdmin)
	p.mu.Lock()
	p.procs = append(p.procs, s)
	p.mu.Unlock()
	return nil
}

// Procs lists the running instances.
func (p *Processes) Procs() []*localcp.Scheduler {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*localcp.Scheduler
	for _, s := range p.procs {
		if !s.Exited() {
			out = append(out, s)
		}
	}
	return out
}

// Leader implements GPUSchedulers.
func (p *Processes) Leader(ctx context.Context) (string, error) { return leaseHolder(ctx, p.C) }

func leaseHolder(ctx context.Context, c *Cluster) (string, error) {
	l, err := c.Client.CoordinationV1().Leases("kube-system").Get(ctx, "gpu-scheduler", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return ptr.Deref(l.Spec.HolderIdentity, ""), nil
}

func (p *Processes) leading(ctx context.Context, s *localcp.Scheduler) bool {
	// The gauge is named after the component, not the lease.
	v, ok := s.Metric(ctx, `leader_election_master_status{name="kube-scheduler"}`)
	return ok && v == "1"
}

// Active implements GPUSchedulers.
func (p *Processes) Active(ctx context.Context) (int, int) {
	procs := p.Procs()
	active := 0
	for _, s := range procs {
		if p.leading(ctx, s) {
			active++
		}
	}
	return active, len(procs)
}

// WaitLeader waits until one running instance leads, and returns it.
func (p *Processes) WaitLeader(ctx context.Context, timeout time.Duration) (*localcp.Scheduler, error) {
	var leader *localcp.Scheduler
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, s := range p.Procs() {
			if p.leading(ctx, s) {
				leader = s
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no leader within %v: %s", timeout, p.Logs())
	}
	return leader, nil
}

// KillLeader SIGKILLs the leading process and starts a new instance.
func (p *Processes) KillLeader(ctx context.Context) error {
	leader, err := p.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		return err
	}
	leader.Kill()
	return p.start(ctx)
}

// AddStandby implements GPUSchedulers.
func (p *Processes) AddStandby(ctx context.Context) error { return p.start(ctx) }

// Recover replaces instances that exited (a leader that could not renew its
// lease while the API server was down stops, by design) and waits for a
// leader. A nil Processes (a deployed cluster) has nothing to recover.
func (p *Processes) Recover(ctx context.Context) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	exited := 0
	var alive []*localcp.Scheduler
	for _, s := range p.procs {
		if s.Exited() {
			exited++
		} else {
			alive = append(alive, s)
		}
	}
	p.procs = alive
	p.mu.Unlock()
	for i := 0; i < exited; i++ {
		if err := p.start(ctx); err != nil {
			return err
		}
	}
	_, err := p.WaitLeader(ctx, time.Minute)
	return err
}

// Logs implements GPUSchedulers.
func (p *Processes) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, s := range p.procs {
		fmt.Fprintf(&b, "--- %s (exited %v):\n%s\n", s.Name, s.Exited(), s.Tail(4000))
	}
	return b.String()
}

// Stop implements GPUSchedulers.
func (p *Processes) Stop() {
	for _, s := range p.Procs() {
		s.Stop(10 * time.Second)
	}
}

// Deployment is gpu-scheduler deployed from manifests/ (kind).
type Deployment struct {
	C *Cluster
}

// Leader implements GPUSchedulers.
func (d *Deployment) Leader(ctx context.Context) (string, error) { return leaseHolder(ctx, d.C) }

func (d *Deployment) pods(ctx context.Context) []v1.Pod {
	list, err := d.C.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpu-scheduler"})
	if err != nil {
		return nil
	}
	return list.Items
}

// KillLeader deletes the leader's pod without grace; the standby takes over
// and the Deployment replaces the pod. The pod's object goes at once, its
// process only when its kubelet gets to it (a second or much more on a busy
// machine), and it leads until then: KillLeader returns once the lease has
// left it (released as it exits, or expired and taken), so that what a test
// does next happens after the failover.
func (d *Deployment) KillLeader(ctx context.Context) error {
	holder, err := d.Leader(ctx)
	if err != nil {
		return err
	}
	killed := false
	for _, p := range d.pods(ctx) {
		// The identity is "<hostname>_<uuid>" and the hostname is the pod's name.
		if strings.HasPrefix(holder, p.Name+"_") {
			if err := d.C.Client.CoreV1().Pods("kube-system").Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				return err
			}
			killed = true
			break
		}
	}
	if !killed {
		return fmt.Errorf("no gpu-scheduler pod holds the lease (%q)", holder)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		h, err := d.Leader(ctx)
		return err == nil && h != holder, nil
	})
	if err != nil {
		return fmt.Errorf("the killed leader %s still holds the lease: %w", holder, err)
	}
	return nil
}

// AddStandby implements GPUSchedulers: the Deployment already has two.
func (d *Deployment) AddStandby(context.Context) error { return nil }

// Active implements GPUSchedulers: a lease held, and renewed within its
// duration, by a replica whose pod is not being deleted (the lease allows
// one holder; a killed replica's name stays on it until it lets go).
func (d *Deployment) Active(ctx context.Context) (int, int) {
	pods := d.pods(ctx)
	l, err := d.C.Client.CoordinationV1().Leases("kube-system").Get(ctx, "gpu-scheduler", metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil ||
		time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
		return 0, len(pods)
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	for _, p := range pods {
		if p.DeletionTimestamp == nil && holder != "" && strings.HasPrefix(holder, p.Name+"_") {
			return 1, len(pods)
		}
	}
	return 0, len(pods)
}

// Logs implements GPUSchedulers: the tail of each replica's log (those of
// replicas already deleted are gone).
func (d *Deployment) Logs() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, p := range d.pods(ctx) {
		out, err := d.C.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &v1.PodLogOptions{TailLines: ptr.To[int64](300)}).DoRaw(ctx)
		fmt.Fprintf(&b, "=== %s on %s (%v)\n%s\n", p.Name, p.Spec.NodeName, err, out)
	}
	return b.String()
}

// Stop implements GPUSchedulers.
func (d *Deployment) Stop() {}

// StartProfile runs one more gpu-scheduler process of a given binary with its
// own profile name and lease, so that a test can give it its own pods
// (schedulerName) without disturbing the main instance.
func StartProfile(ctx context.Context, c *Cluster, binary, profile string, env []string, mutate func(*configv1.KubeSchedulerConfiguration), args ...string) (*localcp.Scheduler, error) {
	kc, err := c.CP.WriteKubeconfig(localcp.UserGPUScheduler, filepath.Join(c.Dir, profile+".kubeconfig"))
	if err != nil {
		return nil, err
	}
	s, err := localcp.StartScheduler(ctx, localcp.SchedulerOptions{
		Name: profile, Binary: binary, Config: manifests.SchedulerConfig, Kubeconfig: kc, Dir: c.Dir, Env: env,
		Args: append([]string{"--v=3"}, args...),
		Mutate: func(cfg *configv1.KubeSchedulerConfiguration) {
			cfg.Profiles[0].SchedulerName = ptr.To(profile)
			// Leader election on its own lease: the RBAC only allows ours, so
			// run it without.
			cfg.LeaderElection.LeaderElect = ptr.To(false)
			if mutate != nil {
				mutate(cfg)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	if err := s.WaitHealthy(ctx, time.Minute); err != nil {
		s.Kill()
		return nil, err
	}
	s.Token = c.CP.Token(localcp.UserAdmin)
	return s, nil
}
