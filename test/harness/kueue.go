package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/yaml"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
)

// Kueue's resources, served by the CRDs the suite installs.
var (
	ResourceFlavors = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "resourceflavors"}
	ClusterQueues   = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "clusterqueues"}
	LocalQueues     = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "localqueues"}
	Workloads       = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
	crds            = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// kueueMetricsCerts is where Kueue's controller reads its metrics server's
// certificate when it does not manage its certificates itself: a fixed
// path in v0.17 (cmd/kueue/main.go), read at startup even with metrics off.
const kueueMetricsCerts = "/etc/kueue/metrics/certs"

// Kueue is Kueue's controller (bin/kueue, built from its module at the
// version hack/tools/kueue pins) and the Job controller of
// kube-controller-manager (the local control plane runs none), against the
// local control plane. Kueue's webhooks are not registered with the API
// server: Jobs are created suspended, with their queue's label, as its
// mutating webhook would make them.
type Kueue struct {
	Dynamic dynamic.Interface
	procs   []*localcp.Proc
	cleanup []func()
}

// StartKueue installs Kueue's CRDs and starts its controller and the Job
// controller. It needs root for Kueue's fixed metrics certificate path.
func StartKueue(ctx context.Context, c *Cluster) (k *Kueue, err error) {
	if !c.Local() {
		return nil, errors.New("Kueue runs against the local control plane only")
	}
	bin, kube := BinDir(), KubeBinDir()
	for _, b := range []string{filepath.Join(bin, "kueue"), filepath.Join(kube, "kube-controller-manager")} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("%s not found (make e2e builds it): %w", b, err)
		}
	}
	k = &Kueue{}
	defer func() {
		if err != nil {
			k.Stop()
			k = nil
		}
	}()
	if k.Dynamic, err = dynamic.NewForConfig(c.Config); err != nil {
		return k, err
	}
	if err := k.installCRDs(ctx, filepath.Join(bin, "kueue-crds")); err != nil {
		return k, err
	}
	dir, err := os.MkdirTemp(c.Dir, "kueue-")
	if err != nil {
		return k, err
	}
	if err := k.writeCerts(dir); err != nil {
		return k, err
	}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kueue-system"}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return k, err
	}
	ports, err := localcp.FreePorts(2)
	if err != nil {
		return k, err
	}
	cfg := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
integrations:
  frameworks: ["batch/job"]
`, ports[0], ports[1], filepath.Join(dir, "webhook"))
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return k, err
	}
	kcm, err := localcp.StartProc(ctx, "kube-controller-manager", filepath.Join(kube, "kube-controller-manager"), []string{
		"--kubeconfig", c.Kubeconfig, "--controllers", "job-controller,garbage-collector-controller",
		"--leader-elect=false", "--secure-port=0", "--v=1",
	}, filepath.Join(dir, "kube-controller-manager.log"))
	if err != nil {
		return k, err
	}
	k.procs = append(k.procs, kcm)
	kq, err := localcp.StartProc(ctx, "kueue", filepath.Join(bin, "kueue"), []string{
		"--config", cfgPath, "--kubeconfig", c.Kubeconfig,
		// Its visibility API would be an aggregated API server of its own.
		"--feature-gates", "VisibilityOnDemand=false",
	}, filepath.Join(dir, "kueue.log"))
	if err != nil {
		return k, err
	}
	k.procs = append(k.procs, kq)
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(90 * time.Second)
	for {
		for _, p := range k.procs {
			if p.Exited() {
				return k, fmt.Errorf("%s exited: %s", p.Name, p.Tail(3000))
			}
		}
		if resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[0])); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return k, nil
			}
		}
		if time.Now().After(deadline) {
			return k, fmt.Errorf("kueue not ready after 90s: %s", kq.Tail(3000))
		}
		select {
		case <-ctx.Done():
			return k, ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// installCRDs creates Kueue's CRDs (from its module, copied by make) and
// waits until they are served.
func (k *Kueue) installCRDs(ctx context.Context, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs in %s (make e2e copies them): %v", dir, err)
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := k.Dynamic.Resource(crds).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s: %w", obj.GetName(), err)
		}
		names = append(names, obj.GetName())
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range names {
		for {
			obj, err := k.Dynamic.Resource(crds).Get(ctx, n, metav1.GetOptions{})
			if err == nil && established(obj) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not established: %v", n, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// writeCerts makes self-signed serving certificates: the webhook server's
// (in dir; no webhook is registered, but the server starts) and the
// metrics server's at its fixed path, removed again by Stop if this run
// created them.
func (k *Kueue) writeCerts(dir string) error {
	cert, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", nil, nil)
	if err != nil {
		return err
	}
	write := func(d string) error {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "tls.crt"), cert, 0o600); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(d, "tls.key"), key, 0o600)
	}
	if err := write(filepath.Join(dir, "webhook")); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(kueueMetricsCerts, "tls.crt")); err == nil {
		return nil // another run's, or the machine's: left as it is
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// The topmost directory this run creates goes again with the files.
	top := kueueMetricsCerts
	for d := kueueMetricsCerts; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		top = d
	}
	if err := write(kueueMetricsCerts); err != nil {
		return fmt.Errorf("Kueue reads its metrics certificate from %s (needs root): %w", kueueMetricsCerts, err)
	}
	k.cleanup = append(k.cleanup, func() {
		if strings.HasPrefix(top, "/etc/kueue") {
			os.RemoveAll(top)
		}
	})
	return nil
}

// Stop stops the controllers and removes what StartKueue wrote outside the
// cluster's directory. The CRDs stay (the control plane goes with the run).
func (k *Kueue) Stop() {
	for i := len(k.procs) - 1; i >= 0; i-- {
		k.procs[i].Stop(10 * time.Second)
	}
	for _, f := range k.cleanup {
		f()
	}
}

// Tail is the end of each controller's log.
func (k *Kueue) Tail(n int) string {
	var b strings.Builder
	for _, p := range k.procs {
		fmt.Fprintf(&b, "--- %s:\n%s\n", p.Name, p.Tail(n))
	}
	return b.String()
}
