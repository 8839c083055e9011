// Package localcp runs a local control plane: etcd and kube-apiserver built
// from the pinned Go modules, on 127.0.0.1 and free ports, with RBAC on and
// static-token users. It starts and stops its own processes; children die
// with the parent (Pdeathsig) so that nothing is orphaned on a crash.
package localcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Static users the control plane knows. The scheduler's user is its
// ServiceAccount's name, so that the RBAC in manifests/ applies to it.
const (
	UserAdmin          = "admin"
	UserKubeScheduler  = "system:kube-scheduler"
	UserGPUScheduler   = "system:serviceaccount:kube-system:gpu-scheduler"
	gpuSchedulerGroups = "system:serviceaccounts,system:serviceaccounts:kube-system,system:authenticated"
)

// Options configure Start.
type Options struct {
	// BinDir holds etcd and kube-apiserver.
	BinDir string
	// Dir is the working directory; a temporary one is made (and removed on
	// Stop) if empty.
	Dir string
	// APIServerArgs are appended to the apiserver's flags.
	APIServerArgs []string
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	Dir        string
	Kubeconfig string // admin
	URL        string
	Config     *rest.Config
	Client     kubernetes.Interface

	// EtcdURL is etcd's client URL.
	EtcdURL string
	// Minor is kube-apiserver's minor version (37 for v1.37.2).
	Minor int

	tokens  map[string]string
	procs   []*Proc
	ownDir  bool
	stopped sync.Once
	mu      sync.Mutex
	apiBin  string
	apiArgs []string
	starts  int
}

// Start launches etcd and kube-apiserver and waits until the apiserver is
// ready. On error, whatever started is stopped again.
func Start(ctx context.Context, opts Options) (cp *ControlPlane, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	cp = &ControlPlane{Dir: opts.Dir, tokens: map[string]string{}}
	if cp.Dir == "" {
		if cp.Dir, err = os.MkdirTemp("", "gpu-scheduler-cp-"); err != nil {
			return nil, err
		}
		cp.ownDir = true
	}
	defer func() {
		if err != nil {
			cp.Stop()
			cp = nil
		}
	}()
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil {
			return cp, fmt.Errorf("%s not found in %s (make binaries builds it): %w", b, opts.BinDir, err)
		}
	}
	if cp.Minor, err = binaryMinor(filepath.Join(opts.BinDir, "kube-apiserver")); err != nil {
		return cp, err
	}
	ports, err := FreePorts(3)
	if err != nil {
		return cp, err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcd, err := StartProc(ctx, "etcd", filepath.Join(opts.BinDir, "etcd"), []string{
		"--name", "default",
		"--data-dir", filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default=" + peerURL,
		"--unsafe-no-fsync", "--log-level", "warn",
		"--quota-backend-bytes", fmt.Sprint(8 << 30),
	}, filepath.Join(cp.Dir, "etcd.log"))
	if err != nil {
		return cp, err
	}
	cp.procs = append(cp.procs, etcd)
	logf("etcd on %s (pid %d)", etcdURL, etcd.Pid())

	if err := writeServiceAccountKeys(cp.Dir); err != nil {
		return cp, err
	}
	var tokens bytes.Buffer
	for _, u := range []struct{ name, groups string }{
		{UserAdmin, "system:masters"},
		{UserKubeScheduler, ""},
		{UserGPUScheduler, gpuSchedulerGroups},
	} {
		tok := randomToken()
		cp.tokens[u.name] = tok
		if u.groups == "" {
			fmt.Fprintf(&tokens, "%s,%s,%s\n", tok, u.name, u.name)
		} else {
			fmt.Fprintf(&tokens, "%s,%s,%s,%q\n", tok, u.name, u.name, u.groups)
		}
	}
	tokenFile := filepath.Join(cp.Dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, tokens.Bytes(), 0o600); err != nil {
		return cp, err
	}
	args := []string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(apiPort),
		"--cert-dir", filepath.Join(cp.Dir, "certs"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(cp.Dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(cp.Dir, "sa.key"),
		"--token-auth-file", tokenFile,
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", "10.0.0.0/24",
		// No controller-manager runs: no token controller for the
		// ServiceAccount admission, and no node lifecycle controller to lift
		// the not-ready taint that TaintNodesByCondition adds to new nodes.
		"--disable-admission-plugins", "ServiceAccount,TaintNodesByCondition",
		"--allow-privileged",
		// Loopback only: no endpoints for the kubernetes Service.
		"--endpoint-reconciler-type", "none",
	}
	if cp.Minor >= 37 {
		// The Workload API (PodGroup, for gangs; beta in v1.37, off by
		// default): a scheduler with GenericWorkload on needs it served.
		// Older minors have no scheduling.k8s.io/v1beta1.
		args = append(args, "--feature-gates", "GenericWorkload=true", "--runtime-config", "scheduling.k8s.io/v1beta1=true")
	}
	args = append(args, opts.APIServerArgs...)
	cp.EtcdURL, cp.apiBin, cp.apiArgs = etcdURL, filepath.Join(opts.BinDir, "kube-apiserver"), args
	api, err := StartProc(ctx, "kube-apiserver", cp.apiBin, args, filepath.Join(cp.Dir, "kube-apiserver.log"))
	if err != nil {
		return cp, err
	}
	cp.procs = append(cp.procs, api)
	cp.URL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	logf("kube-apiserver on %s (pid %d)", cp.URL, api.Pid())

	if err := cp.waitReady(ctx, api); err != nil {
		return cp, err
	}
	if cp.Kubeconfig, err = cp.WriteKubeconfig(UserAdmin, filepath.Join(cp.Dir, "admin.kubeconfig")); err != nil {
		return cp, err
	}
	cp.Config = cp.RESTConfig(UserAdmin)
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return cp, err
	}
	return cp, nil
}

// binaryMinor is the minor version a Kubernetes binary reports
// ("Kubernetes v1.35.4").
func binaryMinor(bin string) (int, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("%s --version: %w", bin, err)
	}
	var major, minor int
	f := strings.Fields(string(out))
	if len(f) < 2 {
		return 0, fmt.Errorf("%s --version: %q", bin, out)
	}
	if _, err := fmt.Sscanf(strings.TrimPrefix(f[len(f)-1], "v"), "%d.%d", &major, &minor); err != nil || major != 1 {
		return 0, fmt.Errorf("%s --version: %q is no Kubernetes version (built without its version stamped?)", bin, out)
	}
	return minor, nil
}

func (cp *ControlPlane) waitReady(ctx context.Context, api *Proc) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // loopback only
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if api.Exited() {
			return fmt.Errorf("kube-apiserver exited: %s", api.Tail(2000))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cp.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cp.tokens[UserAdmin])
		if resp, err := client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready after 90s: %s", api.Tail(2000))
}

// RESTConfig is a client config for one of the static users, with client
// QPS and burst raised as scheduler_perf does.
func (cp *ControlPlane) RESTConfig(user string) *rest.Config {
	return &rest.Config{
		Host:            cp.URL,
		BearerToken:     cp.tokens[user],
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             5000,
		Burst:           5000,
	}
}

// Token returns a static user's bearer token.
func (cp *ControlPlane) Token(user string) string { return cp.tokens[user] }

// WriteKubeconfig writes a kubeconfig for one of the static users.
func (cp *ControlPlane) WriteKubeconfig(user, path string) (string, error) {
	tok, ok := cp.tokens[user]
	if !ok {
		return "", fmt.Errorf("unknown user %q", user)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: cp.URL, InsecureSkipTLSVerify: true}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: tok}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	cfg.CurrentContext = "local"
	return path, clientcmd.WriteToFile(*cfg, path)
}

// Stop stops the processes (TERM, then KILL) and removes a temporary dir.
func (cp *ControlPlane) Stop() {
	cp.stopped.Do(func() {
		for i := len(cp.procs) - 1; i >= 0; i-- {
			cp.procs[i].Stop(10 * time.Second)
		}
		if cp.ownDir && os.Getenv("LOCALCP_KEEP") == "" {
			os.RemoveAll(cp.Dir)
		}
	})
}

// RestartAPIServer stops kube-apiserver, runs during (if any) and waits for
// down, and starts it again on the same port and etcd; it returns once the
// new one is ready. Clients see their connections break and their watches
// end.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context, down time.Duration, during func()) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	i := -1
	for j, p := range cp.procs {
		if p.Name == "kube-apiserver" {
			i = j
		}
	}
	if i < 0 {
		return fmt.Errorf("no kube-apiserver")
	}
	cp.procs[i].Stop(30 * time.Second)
	if during != nil {
		during()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	cp.starts++
	api, err := StartProc(ctx, "kube-apiserver", cp.apiBin, cp.apiArgs, filepath.Join(cp.Dir, fmt.Sprintf("kube-apiserver-%d.log", cp.starts)))
	if err != nil {
		return err
	}
	cp.procs[i] = api
	return cp.waitReady(ctx, api)
}

// CompactEtcd writes a key (so that the revision is past anything a client
// has seen) and compacts etcd's history up to it: a watch resuming from any
// earlier resource version gets 410 Gone. It returns the revision.
func (cp *ControlPlane) CompactEtcd(ctx context.Context) (int64, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.EtcdURL}, DialTimeout: 10 * time.Second})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	resp, err := cli.Put(ctx, "/localcp/compact-probe", time.Now().String())
	if err != nil {
		return 0, err
	}
	rev := resp.Header.Revision
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return 0, err
	}
	return rev, nil
}

// Procs lists the control plane's processes.
func (cp *ControlPlane) Procs() []*Proc { return cp.procs }

func writeServiceAccountKeys(dir string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), priv, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sa.pub"), pub, 0o644)
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// FreePorts asks the kernel for n free loopback ports.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Proc is a child process in its own process group, killed with us.
type Proc struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	log     *os.File
}

// StartProc starts a binary with its output in logPath.
func StartProc(ctx context.Context, name, bin string, args []string, logPath string) (*Proc, error) {
	return StartProcEnv(ctx, name, bin, args, nil, logPath)
}

// StartProcEnv is StartProc with extra environment variables.
func StartProcEnv(ctx context.Context, name, bin string, args, env []string, logPath string) (*Proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group, so Stop reaches its children; killed if we die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{}), log: logf}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process ends.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM to the group, then SIGKILL after the timeout.
func (p *Proc) Stop(timeout time.Duration) {
	if p.Exited() {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill()
	}
}

// Kill sends SIGKILL to the group and waits.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Tail returns the end of the process's log.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// ErrNotStarted is returned when a process could not run.
var ErrNotStarted = errors.New("not started")
