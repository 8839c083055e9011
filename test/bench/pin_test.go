package bench

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// On this project's machines the scheduler under test shares two cores with
// the API server, etcd and the bench itself (which runs the fake kubelet and
// the churn), so load on the control plane takes CPU from the scheduler.
// -pin separates them the way a cluster does: the scheduler alone on the
// last CPU, everything else on the others.
var pin = flag.Bool("pin", false, "run the scheduler under test alone on the last CPU (-pin-cpus), the control plane and the bench on the others")

// On a host with more cores, -pin-cpus gives the scheduler more than one, so
// that it has CPU to spare beside its scheduling loop (as on a control-plane
// node), which this project's 2-core machines cannot show.
var pinN = flag.Int("pin-cpus", 1, "with -pin: how many of the last CPUs the scheduler under test gets (the others need at least one)")

// With -cpu-quota the scheduler gets only that share of its CPU (a cgroup
// v1 CFS quota; needs a writable cpu controller, as root in this
// project's sandboxes), so that it, not the control plane, limits the
// stream both on a quiet cluster and under churn: the ratio then measures
// what the churn costs the scheduler itself.
var cpuQuota = flag.Float64("cpu-quota", 0, "cap the scheduler under test at this many CPUs (cgroup v1 CFS quota); 0: no cap")

// tpEnv is set for the scheduler under test only: -scheduler-env GOGC=200,
// repeated for more than one.
var tpEnv envFlag

func init() {
	flag.Var(&tpEnv, "scheduler-env", "VAR=value set for the scheduler under test only (GOGC=200); repeat for more")
}

type envFlag []string

func (e *envFlag) String() string { return strings.Join(*e, " ") }

func (e *envFlag) Set(v string) error {
	if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
		return fmt.Errorf("%q is not VAR=value", v)
	}
	*e = append(*e, v)
	return nil
}

// cgroupRoot is the cgroup v1 cpu controller's mount.
const cgroupRoot = "/sys/fs/cgroup/cpu"

// capCPU puts a process in a new cpu cgroup limited to quota CPUs. The
// returned func removes the cgroup once the process has ended.
func capCPU(pid int, quota float64) (func(), error) {
	dir := filepath.Join(cgroupRoot, fmt.Sprintf("gpu-scheduler-bench-%d", pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("-cpu-quota needs a writable cgroup v1 cpu controller at %s: %w", cgroupRoot, err)
	}
	remove := func() {
		// The process has ended: the cgroup is empty and can go.
		for i := 0; i < 50 && os.Remove(dir) != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
	const period = 100000 // µs
	for _, w := range []struct{ file, value string }{
		{"cpu.cfs_period_us", strconv.Itoa(period)},
		{"cpu.cfs_quota_us", strconv.Itoa(int(quota * period))},
		{"cgroup.procs", strconv.Itoa(pid)},
	} {
		if err := os.WriteFile(filepath.Join(dir, w.file), []byte(w.value), 0o644); err != nil {
			remove()
			return nil, fmt.Errorf("cgroup %s: %w", w.file, err)
		}
	}
	return remove, nil
}

// pinCPUs returns the CPUs for the scheduler under test and for the rest.
func pinCPUs() (sched, rest []int) {
	n, k := runtime.NumCPU(), max(1, *pinN)
	if n <= k {
		return nil, nil
	}
	for c := 0; c < n; c++ {
		if c < n-k {
			rest = append(rest, c)
		} else {
			sched = append(sched, c)
		}
	}
	return sched, rest
}

// pinProcess sets the CPU affinity of every thread of a process. Threads
// created later inherit it from their creator; two sweeps catch one started
// during the first.
func pinProcess(pid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	for sweep := 0; sweep < 2; sweep++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return err
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("pinning thread %d of %d: %w", tid, pid, err)
			}
		}
	}
	return nil
}

// pinControlPlane moves the API server, etcd and the bench off the
// scheduler's CPU.
func pinControlPlane() error {
	_, rest := pinCPUs()
	if rest == nil {
		return fmt.Errorf("-pin needs more CPUs than -pin-cpus (%d): %d", *pinN, runtime.NumCPU())
	}
	for _, p := range cluster.CP.Procs() {
		if err := pinProcess(p.Pid(), rest); err != nil {
			return err
		}
	}
	return pinProcess(os.Getpid(), rest)
}

// othersCPU is the CPU time of every process but the scheduler under test.
func othersCPU() map[string]float64 {
	m := map[string]float64{"bench": procCPU(os.Getpid())}
	for _, p := range cluster.CP.Procs() {
		m[p.Name] = procCPU(p.Pid())
	}
	return m
}
