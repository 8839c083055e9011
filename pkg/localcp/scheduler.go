package localcp

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	configv1 "k8s.io/kube-scheduler/config/v1"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"

	_ "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme" // our args
)

// RenderSchedulerConfig decodes a KubeSchedulerConfiguration as written (no
// defaulting), lets mutate change it, and encodes it back as YAML.
func RenderSchedulerConfig(base []byte, mutate func(*configv1.KubeSchedulerConfiguration)) ([]byte, error) {
	obj, _, err := kubeschedulerscheme.Codecs.UniversalDeserializer().Decode(base, nil, &configv1.KubeSchedulerConfiguration{})
	if err != nil {
		return nil, err
	}
	cfg, ok := obj.(*configv1.KubeSchedulerConfiguration)
	if !ok {
		return nil, fmt.Errorf("not a v1 KubeSchedulerConfiguration: %T", obj)
	}
	// Plugin args stay raw unless decoded: type them, so mutate can edit.
	if err := cfg.DecodeNestedObjects(kubeschedulerscheme.Codecs.UniversalDeserializer()); err != nil {
		return nil, err
	}
	if mutate != nil {
		mutate(cfg)
	}
	yaml := json.NewYAMLSerializer(json.DefaultMetaFactory, kubeschedulerscheme.Scheme, kubeschedulerscheme.Scheme)
	var buf bytes.Buffer
	if err := kubeschedulerscheme.Codecs.EncoderForVersion(yaml, configv1.SchemeGroupVersion).Encode(cfg, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// SchedulerOptions run a kube-scheduler build (ours or the vanilla one).
type SchedulerOptions struct {
	Name       string // for logs and files
	Binary     string
	Config     []byte // KubeSchedulerConfiguration; clientConnection is set here
	Kubeconfig string
	Dir        string
	Args       []string
	// Mutate adjusts the configuration (leader election timings, ...).
	Mutate func(*configv1.KubeSchedulerConfiguration)
	// Env is added to the process environment.
	Env []string
}

// Scheduler is a scheduler process serving on 127.0.0.1:Port.
type Scheduler struct {
	*Proc
	Port       int
	ConfigPath string
	// Token authenticates requests beyond the health checks (metrics):
	// the secure port delegates authentication to the apiserver.
	Token string
}

// StartScheduler starts the scheduler on a free secure port on loopback.
func StartScheduler(ctx context.Context, o SchedulerOptions) (*Scheduler, error) {
	cfg, err := RenderSchedulerConfig(o.Config, func(c *configv1.KubeSchedulerConfiguration) {
		c.ClientConnection.Kubeconfig = o.Kubeconfig
		c.ClientConnection.QPS = 5000
		c.ClientConnection.Burst = 5000
		if o.Mutate != nil {
			o.Mutate(c)
		}
	})
	if err != nil {
		return nil, err
	}
	ports, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(o.Dir, o.Name+"-config.yaml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return nil, err
	}
	args := append([]string{"--config", path, "--secure-port", fmt.Sprint(ports[0]), "--bind-address", "127.0.0.1",
		"--cert-dir", filepath.Join(o.Dir, o.Name+"-certs"),
		// Out of a cluster, the secure port's delegated authentication and
		// authorization need a kubeconfig (in a pod they use its own).
		"--authentication-kubeconfig", o.Kubeconfig, "--authorization-kubeconfig", o.Kubeconfig}, o.Args...)
	p, err := StartProcEnv(ctx, o.Name, o.Binary, args, o.Env, filepath.Join(o.Dir, o.Name+".log"))
	if err != nil {
		return nil, err
	}
	return &Scheduler{Proc: p, Port: ports[0], ConfigPath: path}, nil
}

var insecureLoopback = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// Get fetches a path of the scheduler's secure port (health and metrics are
// allowed without authentication on loopback), within 2 s.
func (s *Scheduler) Get(ctx context.Context, path string) (int, string, error) {
	return s.GetWithin(ctx, path, 2*time.Second)
}

// GetWithin is Get with a time limit, for slow endpoints such as a CPU profile.
func (s *Scheduler) GetWithin(ctx context.Context, path string, limit time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", s.Port, path), nil)
	if err != nil {
		return 0, "", err
	}
	if s.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.Token)
	}
	resp, err := insecureLoopback.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// WaitHealthy waits for /healthz (serving, informers started).
func (s *Scheduler) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	return s.waitOK(ctx, "/healthz", "healthy", timeout)
}

// WaitReady waits for /readyz: its caches synced and its event handlers
// through the initial list (kube-scheduler's sched-handler-sync).
func (s *Scheduler) WaitReady(ctx context.Context, timeout time.Duration) error {
	return s.waitOK(ctx, "/readyz", "ready", timeout)
}

func (s *Scheduler) waitOK(ctx context.Context, path, what string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if s.Exited() {
			return fmt.Errorf("%s exited: %s", s.Name, s.Tail(3000))
		}
		if code, _, err := s.Get(ctx, path); err == nil && code == http.StatusOK {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not %s after %v: %s", s.Name, what, timeout, s.Tail(3000))
}

// Metric returns the value of the first sample line starting with prefix on
// /metrics (prefix includes the name and, if needed, the labels).
func (s *Scheduler) Metric(ctx context.Context, prefix string) (string, bool) {
	_, body, err := s.Get(ctx, "/metrics")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			return f[len(f)-1], true
		}
	}
	return "", false
}
