package version

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCheckServer(t *testing.T) {
	for _, tc := range []struct {
		major, minor string
		ok           bool
	}{
		{"1", "35", true}, {"1", "36+", true}, {"1", "37", true},
		{"1", "34", false}, {"1", "38", false}, {"2", "0", false}, {"1", "x", false},
	} {
		err := CheckServer(tc.major, tc.minor)
		if (err == nil) != tc.ok {
			t.Errorf("%s.%s: %v", tc.major, tc.minor, err)
		}
		if err != nil && !strings.Contains(err.Error(), Supported()) {
			t.Errorf("%s.%s: the error does not name the supported versions: %v", tc.major, tc.minor, err)
		}
	}
}

// The supported minors are written in several places; they must agree:
// hack/k8s-minors (what the suite builds and runs), SupportedMinors (what
// the binary accepts), the modules that build each minor, the chart's
// kubeVersion and the README's matrix.
func TestSupportedMinorsAgree(t *testing.T) {
	root := filepath.Join("..", "..")
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	type minor struct{ minor, release, etcd string }
	var listed []minor
	for _, line := range strings.Split(read("hack/k8s-minors"), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			if len(f) != 3 {
				t.Fatalf("hack/k8s-minors: %q: want minor, release, etcd", line)
			}
			listed = append(listed, minor{f[0], f[1], f[2]})
		}
	}
	var names []string
	for _, m := range listed {
		names = append(names, m.minor)
	}
	var want []string
	for _, m := range SupportedMinors {
		want = append(want, fmt.Sprintf("1.%d", m))
	}
	if !slices.Equal(names, want) {
		t.Fatalf("hack/k8s-minors lists %v, SupportedMinors %v", names, want)
	}
	// Each minor's release and etcd are what its module builds: the main
	// module for the newest, hack/tools/k8s-<minor> for the others.
	requires := func(gomod, mod string) string {
		for _, line := range strings.Split(gomod, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == mod {
				return f[1]
			}
		}
		return ""
	}
	for i, m := range listed {
		gomod := "go.mod"
		if i < len(listed)-1 {
			gomod = filepath.Join("hack", "tools", "k8s-"+m.minor, "go.mod")
		}
		mod := read(gomod)
		if got := requires(mod, "k8s.io/kubernetes"); got != m.release || !strings.HasPrefix(got, "v"+m.minor+".") {
			t.Errorf("%s: k8s.io/kubernetes %s, hack/k8s-minors says %s for %s", gomod, got, m.release, m.minor)
		}
		if got := requires(mod, "go.etcd.io/etcd/server/v3"); got != m.etcd {
			t.Errorf("%s: etcd %s, hack/k8s-minors says %s", gomod, got, m.etcd)
		}
		if i < len(listed)-1 {
			// Everything the Makefile's k8s-% rules build (make e2e, make
			// e2e-kind K8S=<minor>) is a tool of the module.
			for _, cmd := range []string{"go.etcd.io/etcd/server/v3", "k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-scheduler",
				"k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kubeadm",
				"k8s.io/kubernetes/cmd/kubectl", "k8s.io/kubernetes/cmd/kube-proxy"} {
				if !strings.Contains(mod, "\t"+cmd+"\n") {
					t.Errorf("%s: %s is not a tool", gomod, cmd)
				}
			}
		}
		if row := fmt.Sprintf("| %s | %s, etcd %s |", m.minor, m.release, m.etcd); !strings.Contains(read("README.md"), row) {
			t.Errorf("README.md has no matrix row %q", row)
		}
	}
	chart := read("manifests/charts/gpu-scheduler/Chart.yaml")
	kv := fmt.Sprintf(`kubeVersion: ">=1.%d.0-0 <1.%d.0-0"`, SupportedMinors[0], SupportedMinors[len(SupportedMinors)-1]+1)
	if !strings.Contains(chart, kv) {
		t.Errorf("the chart's kubeVersion is not %s", kv)
	}
	if !strings.Contains(read("README.md"), fmt.Sprintf("`kubeVersion` is `>=1.%d.0-0 <1.%d.0-0`", SupportedMinors[0], SupportedMinors[len(SupportedMinors)-1]+1)) {
		t.Error("the README's kubeVersion differs from the chart's")
	}
	// No row for a minor that is not supported.
	for _, line := range strings.Split(read("README.md"), "\n") {
		var mi int
		if _, err := fmt.Sscanf(line, "| 1.%d | v1.", &mi); err == nil && !slices.Contains(SupportedMinors, mi) {
			t.Errorf("README.md's matrix has a row for 1.%d, which is not supported", mi)
		}
	}
}
