package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubeapply"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/version"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

const chart = "../../manifests/charts/gpu-scheduler"

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(harness.BinDir(), "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v (make %s)", bin, err, bin)
	}
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

// The Helm chart: helm lint passes, and helm template with the default
// values and with others renders objects the kube-apiserver accepts
// (server-side dry run) and a configuration the scheduler loads. With the
// defaults it renders exactly the files in manifests/ it is made from.
func TestHelmChart(t *testing.T) {
	if out, err := helm(t, "lint", chart, "--namespace", "kube-system", "--kube-version", "1.37.2"); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	a, err := kubeapply.New(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	// A release elsewhere needs its namespace.
	if _, err := cluster.Client.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu-team"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		release, namespace string // gpu-scheduler in kube-system unless set
		set                []string
		check              func(t *testing.T, objs []*unstructured.Unstructured, cfg *ourconfig.GPUScoreArgs, fit *ourconfig.GPUFitArgs)
	}{
		"defaults": {check: func(t *testing.T, objs []*unstructured.Unstructured, score *ourconfig.GPUScoreArgs, fit *ourconfig.GPUFitArgs) {
			// One source: the chart renders manifests/deployment.yaml
			// (make manifests) and the objects of the RBAC and admission
			// policy files, as they are but for the chart's labels.
			var deploy []string
			for _, o := range objs {
				if o.GetKind() == "Deployment" {
					deploy = append(deploy, o.GetName())
				}
			}
			if len(deploy) != 1 {
				t.Fatalf("deployments %v", deploy)
			}
			if score.Policy != "Fragmentation" || !fit.HAMi.Enabled || fit.AccountingOnlySharing {
				t.Errorf("default config: policy %s, hami %v, accounting-only %v", score.Policy, fit.HAMi.Enabled, fit.AccountingOnlySharing)
			}
			rendered := map[string]*unstructured.Unstructured{}
			for _, o := range objs {
				rendered[objKey(o)] = o
			}
			for _, file := range [][]byte{manifests.RBAC, manifests.AdmissionPolicy} {
				want, err := kubeapply.Decode(file)
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range want {
					got := rendered[objKey(w)]
					if got == nil {
						t.Errorf("%s: not rendered", objKey(w))
						continue
					}
					g := got.DeepCopy()
					g.SetLabels(nil)
					if !equality.Semantic.DeepEqual(g.Object, w.Object) {
						t.Errorf("%s differs from manifests/:\n got %v\nwant %v", objKey(w), g.Object, w.Object)
					}
				}
			}
			if rendered["PodDisruptionBudget/kube-system/gpu-scheduler"] == nil {
				t.Errorf("no PodDisruptionBudget with two replicas")
			}
			checkReferences(t, objs)
		}},
		// Any namespace, any release name: every name is the release's
		// (cluster-scoped ones too, so that two releases do not collide),
		// every namespaced object in the release's namespace but the role
		// binding kube-system holds for delegated authentication, and the
		// lease, the policies' user and the bindings' subjects follow.
		"another namespace and release": {release: "team-a", namespace: "gpu-team",
			set: []string{"monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true",
				"extraArgs[0]=--kube-api-qps=100", "podAnnotations.team=a", "podLabels.team=a", "imagePullSecrets[0].name=registry",
				`json:topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"topology.kubernetes.io/zone","whenUnsatisfiable":"ScheduleAnyway",` +
					`"labelSelector":{"matchLabels":{"app.kubernetes.io/instance":"{{ .Release.Name }}"}}}]`},
			check: func(t *testing.T, objs []*unstructured.Unstructured, score *ourconfig.GPUScoreArgs, fit *ourconfig.GPUFitArgs) {
				checkRelease(t, objs, "team-a", "gpu-team", "team-a-gpu-scheduler")
				if p := score.TargetWorkload.PublishTo; p != "gpu-team/team-a-gpu-scheduler" {
					t.Errorf("publishTo %q, want the release's lease gpu-team/team-a-gpu-scheduler", p)
				}
				kinds := map[string]bool{}
				for _, o := range objs {
					kinds[o.GetKind()] = true
					if o.GetKind() != "Deployment" {
						continue
					}
					spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
					meta, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "metadata")
					text := fmt.Sprint(spec, meta)
					for _, want := range []string{"--kube-api-qps=100", "team:a", "registry", "topology.kubernetes.io/zone", "app.kubernetes.io/instance:team-a"} {
						if !strings.Contains(text, want) {
							t.Errorf("deployment: no %s in %s", want, text)
						}
					}
				}
				for _, k := range []string{"PodMonitor", "PrometheusRule", "PodDisruptionBudget", "Secret"} {
					if !kinds[k] {
						t.Errorf("no %s", k)
					}
				}
				if kinds["ServiceMonitor"] || kinds["Service"] {
					t.Errorf("a PodMonitor needs no Service nor ServiceMonitor")
				}
			}},
		// The operator brings the ServiceAccount and its RBAC: none
		// rendered, and the policies guard the account named.
		"no RBAC, own ServiceAccount, one replica": {release: "team-b", namespace: "gpu-team",
			set: []string{"rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=sched", "replicaCount=1", "leaderElection=false"},
			check: func(t *testing.T, objs []*unstructured.Unstructured, score *ourconfig.GPUScoreArgs, fit *ourconfig.GPUFitArgs) {
				checkRelease(t, objs, "team-b", "gpu-team", "sched")
				// No leader election, no lease to publish the learned target on.
				if p := score.TargetWorkload.PublishTo; p != "" {
					t.Errorf("publishTo %q without leader election", p)
				}
				for _, o := range objs {
					switch o.GetKind() {
					case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "PodDisruptionBudget":
						t.Errorf("%s rendered", objKey(o))
					}
				}
			}},
		"plain nodes, BestFit, three replicas, gangs, monitoring": {
			set: []string{"nodeAgent=plain", "accountingOnlySharing=true", "replicaCount=3", "pluginArgs.GPUScore.policy=BestFit",
				"pluginArgs.GPUPreemption.minCandidateNodesAbsolute=50", "pluginArgs.GPUScore.targetWorkload.halfLifePods=0",
				"pluginArgs.GPUFit.requeue.enabled=false", "pluginArgs.NodeResourcesFitFast.ignoredResources={nvidia.com/gpumem,example.com/x}", "schedulerName=gpu-x", "featureGates.GenericWorkload=true", "image.tag=v9.9.9",
				"monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true",
				"monitoring.serviceMonitor.labels.release=kps", "monitoring.prometheusRule.labels.release=kps",
				"nodeSelector.node-role\\.kubernetes\\.io/control-plane=", "tolerations[0].key=node-role.kubernetes.io/control-plane",
				"tolerations[0].operator=Exists", "tolerations[0].effect=NoSchedule",
				"admissionPolicy.enabled=false"},
			check: func(t *testing.T, objs []*unstructured.Unstructured, score *ourconfig.GPUScoreArgs, fit *ourconfig.GPUFitArgs) {
				if score.Policy != "BestFit" || fit.HAMi.Enabled || !fit.AccountingOnlySharing {
					t.Errorf("config: policy %s, hami %v, accounting-only %v", score.Policy, fit.HAMi.Enabled, fit.AccountingOnlySharing)
				}
				// Zero and false values merge too (sprig's mergeOverwrite drops them).
				if score.TargetWorkload.HalfLifePods != 0 || score.TargetWorkload.CoveragePercent != 95 || fit.Requeue.Enabled {
					t.Errorf("config: halfLifePods %d (want 0), coveragePercent %d (want 95), requeue enabled %v (want false)",
						score.TargetWorkload.HalfLifePods, score.TargetWorkload.CoveragePercent, fit.Requeue.Enabled)
				}
				kinds := map[string]bool{}
				for _, o := range objs {
					kinds[o.GetKind()] = true
					if o.GetKind() == "Deployment" {
						r, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas")
						n := fmt.Sprint(r)
						cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
						c := cs[0].(map[string]interface{})
						if n != "3" || c["image"] != "gpu-scheduler:v9.9.9" || !strings.Contains(strings.Join(toStrings(c["args"]), " "), "--feature-gates=GenericWorkload=true") {
							t.Errorf("deployment: replicas %s, image %v, args %v", n, c["image"], c["args"])
						}
						tol, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "tolerations")
						sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "spec", "nodeSelector")
						if _, ok := sel["node-role.kubernetes.io/control-plane"]; !ok || len(tol) != 1 {
							t.Errorf("deployment: nodeSelector %v, tolerations %v", sel, tol)
						}
					}
					if o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-config") {
						d, _, _ := unstructured.NestedString(o.Object, "data", "scheduler-config.yaml")
						cfg, _ := offline.LoadConfig([]byte(d))
						var got string
						for _, pc := range cfg.Profiles[0].PluginConfig {
							if u, ok := pc.Args.(*runtime.Unknown); ok && pc.Name == "NodeResourcesFitFast" {
								got = string(u.Raw)
							}
						}
						if !strings.Contains(got, `"ignoredResources":["nvidia.com/gpumem","example.com/x"]`) {
							t.Errorf("NodeResourcesFitFast's args: %s", got)
						}
					}
					if o.GetKind() == "ConfigMap" && o.GetName() == "gpu-scheduler-dashboard" {
						d, _, _ := unstructured.NestedString(o.Object, "data", "gpu-scheduler.json")
						if strings.Contains(d, `profile=\"gpu-scheduler\"`) || !strings.Contains(d, `profile=\"gpu-x\"`) {
							t.Errorf("the dashboard does not read the profile gpu-x")
						}
					}
					if o.GetAPIVersion() == "monitoring.coreos.com/v1" && o.GetLabels()["release"] != "kps" {
						t.Errorf("%s: labels %v, want release=kps", o.GetKind(), o.GetLabels())
					}
				}
				for _, k := range []string{"ServiceMonitor", "PrometheusRule", "Service"} {
					if !kinds[k] {
						t.Errorf("no %s", k)
					}
				}
				// The tenant policies are off; the scheduler's own rights
				// stay guarded, and with no HAMi there is no node lock to
				// take: no right to patch nodes, and no policy for it.
				for _, o := range objs {
					switch {
					case o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() != "gpu-scheduler-scope":
						t.Errorf("%s rendered (admissionPolicy.enabled=false, nodeAgent=plain)", objKey(o))
					case strings.HasSuffix(o.GetName(), "node-lock"):
						t.Errorf("%s rendered with nodeAgent=plain", objKey(o))
					}
				}
				if !kinds["ValidatingAdmissionPolicy"] {
					t.Errorf("gpu-scheduler-scope not rendered: it guards rights the chart grants")
				}
			}},
	} {
		t.Run(name, func(t *testing.T) {
			release, ns := tc.release, tc.namespace
			if release == "" {
				release, ns = "gpu-scheduler", "kube-system"
			}
			args := []string{"template", release, chart, "--namespace", ns, "--kube-version", "1.37.2"}
			for _, s := range tc.set {
				if v, ok := strings.CutPrefix(s, "json:"); ok {
					args = append(args, "--set-json", v)
				} else {
					args = append(args, "--set", s)
				}
			}
			out, err := helm(t, args...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			objs, err := kubeapply.Decode([]byte(out))
			if err != nil {
				t.Fatal(err)
			}
			var score *ourconfig.GPUScoreArgs
			var fit *ourconfig.GPUFitArgs
			for _, o := range objs {
				if o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-config") {
					data, _, _ := unstructured.NestedString(o.Object, "data", "scheduler-config.yaml")
					cfg, err := offline.LoadConfig([]byte(data))
					if err != nil {
						t.Fatalf("the rendered configuration does not load: %v\n%s", err, data)
					}
					for _, pc := range cfg.Profiles[0].PluginConfig {
						switch a := pc.Args.(type) {
						case *ourconfig.GPUScoreArgs:
							score = a
						case *ourconfig.GPUFitArgs:
							fit = a
						}
					}
				}
				if o.GetAPIVersion() == "monitoring.coreos.com/v1" {
					continue // no prometheus-operator here: its CRDs are not served
				}
				if _, err := a.ApplyObject(context.Background(), o, ns, true); err != nil {
					t.Errorf("server-side dry run of %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
			if score == nil || fit == nil {
				t.Fatal("no GPUScore or GPUFit args in the rendered configuration")
			}
			// The prometheus-operator objects against their Go types,
			// strictly, and the PrometheusRule's rules as promtool reads them.
			rendered := filepath.Join(t.TempDir(), "rendered.yaml")
			if err := os.WriteFile(rendered, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			if res, err := exec.Command(filepath.Join(harness.BinDir(), "promrules"), "-objects", rendered).CombinedOutput(); err != nil {
				t.Errorf("promrules -objects: %v\n%s", err, res)
			}
			tc.check(t, objs, score, fit)
		})
	}
	// The files it is made from are manifests/'s, and deployment.yaml is
	// its rendering.
	out, err := helm(t, "template", "gpu-scheduler", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--show-only", "templates/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(out, "\n") {
		// Applied by kubectl, it is not managed by Helm.
		if l != "---" && !strings.HasPrefix(l, "# Source:") && !strings.Contains(l, "app.kubernetes.io/managed-by: Helm") {
			kept = append(kept, l)
		}
	}
	if want := strings.TrimPrefix(string(manifests.Deployment), "# Generated from charts/gpu-scheduler (default values) by make manifests. Do not edit.\n"); strings.Join(kept, "\n") != want {
		t.Errorf("manifests/deployment.yaml is not the chart's rendering: run make manifests")
	}
	if out, err := helm(t, "template", "x", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--set", "nodeAgent=other"); err == nil || !strings.Contains(out, "nodeAgent") || !strings.Contains(out, "'hami', 'plain'") {
		t.Errorf("an unknown nodeAgent: %v\n%s", err, out)
	}
	// values.schema.json: a misspelt plugin or value is refused, not ignored.
	for _, bad := range []string{"pluginArgs.GpuScore.policy=BestFit", "replicaCount=0", "monitoring.serviceMonitor.intervall=1m", "image.pullPolicy=Sometimes"} {
		if out, err := helm(t, "template", "x", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--set", bad); err == nil || !strings.Contains(out, "schema") {
			t.Errorf("--set %s: %v\n%s", bad, err, out)
		}
	}
	if out, err := helm(t, "template", "x", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--set", "leaderElection=false"); err == nil || !strings.Contains(out, "several active schedulers") {
		t.Errorf("two replicas without leader election: %v\n%s", err, out)
	}
	if out, err := helm(t, "template", "x", chart, "--namespace", "default", "--kube-version", "1.37.2", "--set", "serviceAccount.create=false"); err == nil || !strings.Contains(out, "serviceAccount.name") {
		t.Errorf("no ServiceAccount named: %v\n%s", err, out)
	}
	if out, err := helm(t, "template", "x", chart, "--namespace", "default", "--kube-version", "1.37.2", "--set", "monitoring.podMonitor.enabled=true,monitoring.serviceMonitor.enabled=true"); err == nil || !strings.Contains(out, "not both") {
		t.Errorf("a PodMonitor and a ServiceMonitor: %v\n%s", err, out)
	}
	if out, err := helm(t, "template", "x", chart, "--namespace", "default", "--kube-version", "1.37.2", "--set", "monitoring.podMonitor.enabled=true,rbac.create=false"); err == nil || !strings.Contains(out, "secretName") {
		t.Errorf("monitoring without RBAC nor a token: %v\n%s", err, out)
	}
	// Two releases side by side: no object of one is the other's, and the
	// second's tenant-facing policies let the first's scheduler write its
	// assignments (otherwise each would deny the other's bindings).
	a1, err := helm(t, "template", "gpu-scheduler", chart, "--namespace", "kube-system", "--kube-version", "1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := helm(t, "template", "other", chart, "--namespace", "kube-system", "--kube-version", "1.37.2", "--set", "schedulerName=other",
		"--set", "admissionPolicy.otherSchedulers[0]=system:serviceaccount:kube-system:gpu-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	o1, _ := kubeapply.Decode([]byte(a1))
	o2, _ := kubeapply.Decode([]byte(a2))
	first := map[string]bool{}
	for _, o := range o1 {
		first[objKey(o)] = true
	}
	exempt := 0
	for _, o := range o2 {
		if first[objKey(o)] {
			t.Errorf("two releases both render %s", objKey(o))
		}
		conds, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchConditions")
		for _, c := range conds {
			if e := fmt.Sprint(c.(map[string]interface{})["expression"]); strings.HasPrefix(e, "!(") {
				exempt++
				if e != "!(request.userInfo.username in ['system:serviceaccount:kube-system:other-gpu-scheduler', 'system:serviceaccount:kube-system:gpu-scheduler'])" {
					t.Errorf("%s exempts %s", objKey(o), e)
				}
			}
		}
	}
	if exempt != 2 {
		t.Errorf("%d tenant-facing policies exempt the schedulers, want 2", exempt)
	}
	// As a subchart: the parent's values reach it under its name and the
	// global ones beside them, which a strict schema must allow.
	parent := t.TempDir()
	if err := os.WriteFile(filepath.Join(parent, "Chart.yaml"), []byte("apiVersion: v2\nname: platform\nversion: 1.0.0\n"+
		"dependencies:\n- name: gpu-scheduler\n  version: \"*\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent, "values.yaml"), []byte("global:\n  imageRegistry: registry.example\n"+
		"gpu-scheduler:\n  replicaCount: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(parent, "charts", "gpu-scheduler"), os.DirFS(chart)); err != nil {
		t.Fatal(err)
	}
	if out, err := helm(t, "lint", parent, "--namespace", "platform", "--kube-version", "1.37.2"); err != nil {
		t.Errorf("helm lint of a parent chart: %v\n%s", err, out)
	}
	out, err = helm(t, "template", "plat", parent, "--namespace", "platform", "--kube-version", "1.37.2")
	if err != nil {
		t.Fatalf("as a subchart: %v\n%s", err, out)
	}
	sub, err := kubeapply.Decode([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range sub {
		if o.GetKind() == "Deployment" && o.GetName() == "plat-gpu-scheduler" && o.GetNamespace() == "platform" {
			r, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas")
			found = fmt.Sprint(r) == "3"
		}
	}
	if !found {
		t.Errorf("as a subchart: no Deployment platform/plat-gpu-scheduler with the parent's 3 replicas")
	}
}

func objKey(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + "/" + o.GetName()
	}
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}

// checkRelease checks a release's objects: named after it, in its
// namespace (but the role binding kube-system holds for delegated
// authentication), the configuration's lease its own, and the ServiceAccount
// sa the one the Deployment runs as, the bindings name and the admission
// policies guard.
func checkRelease(t *testing.T, objs []*unstructured.Unstructured, release, ns, sa string) {
	t.Helper()
	user := "system:serviceaccount:" + ns + ":" + sa
	policies := 0
	for _, o := range objs {
		key := objKey(o)
		if !strings.HasPrefix(o.GetName(), release+"-") && o.GetName() != sa {
			t.Errorf("%s: not named after release %s", key, release)
		}
		switch {
		case strings.HasSuffix(o.GetName(), "-extension-apiserver-authentication-reader"):
			if o.GetNamespace() != "kube-system" {
				t.Errorf("%s: the authentication reader role is kube-system's", key)
			}
		case o.GetNamespace() != "" && o.GetNamespace() != ns:
			t.Errorf("%s: outside namespace %s", key, ns)
		}
		if l := o.GetLabels(); l["app.kubernetes.io/instance"] != release || l["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("%s: labels %v", key, l)
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, sub := range subjects {
			m := sub.(map[string]interface{})
			if m["kind"] == "ServiceAccount" && !strings.HasSuffix(o.GetName(), "-metrics-reader") && (m["name"] != sa || m["namespace"] != ns) {
				t.Errorf("%s: subject %v, want %s/%s", key, m, ns, sa)
			}
		}
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			policies++
			text := fmt.Sprint(o.Object)
			if !strings.Contains(text, "'"+user+"'") || strings.Contains(text, "kube-system:gpu-scheduler") {
				t.Errorf("%s does not guard %s", key, user)
			}
		case "Deployment":
			if got, _, _ := unstructured.NestedString(o.Object, "spec", "template", "spec", "serviceAccountName"); got != sa {
				t.Errorf("%s runs as %q, want %q", key, got, sa)
			}
		case "ConfigMap":
			data, _, _ := unstructured.NestedString(o.Object, "data", "scheduler-config.yaml")
			cfg, err := offline.LoadConfig([]byte(data))
			if strings.HasSuffix(o.GetName(), "-dashboard") {
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if le := cfg.LeaderElection; le.ResourceName != release+"-gpu-scheduler" || le.ResourceNamespace != ns {
				t.Errorf("%s: the lease is %s/%s, want %s/%s-gpu-scheduler", key, le.ResourceNamespace, le.ResourceName, ns, release)
			}
		case "Role":
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			if !strings.Contains(fmt.Sprint(rules), "resourceNames:["+release+"-gpu-scheduler]") {
				t.Errorf("%s: %v does not name the lease %s-gpu-scheduler", key, rules, release)
			}
		}
	}
	if policies == 0 {
		t.Errorf("no admission policy")
	}
	checkReferences(t, objs)
}

// checkReferences: every role a binding of the release names, and every
// policy a policy binding names, is rendered (the server's dry run does
// not check it).
func checkReferences(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	have := map[string]bool{}
	for _, o := range objs {
		have[o.GetKind()+"/"+o.GetName()] = true
	}
	for _, o := range objs {
		if ref, ok, _ := unstructured.NestedStringMap(o.Object, "roleRef"); ok && !strings.HasPrefix(ref["name"], "system:") &&
			ref["name"] != "extension-apiserver-authentication-reader" && !have[ref["kind"]+"/"+ref["name"]] {
			t.Errorf("%s binds %s/%s, which is not rendered", objKey(o), ref["kind"], ref["name"])
		}
		if name, ok, _ := unstructured.NestedString(o.Object, "spec", "policyName"); ok && !have["ValidatingAdmissionPolicy/"+name] {
			t.Errorf("%s binds policy %s, which is not rendered", objKey(o), name)
		}
	}
}

func toStrings(v interface{}) []string {
	var out []string
	if l, ok := v.([]interface{}); ok {
		for _, x := range l {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// The chart installs on every supported minor and refuses the others
// (its kubeVersion; TestSupportedMinorsAgree keeps it in step with the
// supported minors).
func TestHelmChartKubeVersions(t *testing.T) {
	for _, m := range version.SupportedMinors {
		if out, err := helm(t, "template", "gpu-scheduler", chart, "--namespace", "kube-system", "--kube-version", fmt.Sprintf("1.%d.0", m)); err != nil {
			t.Errorf("1.%d: %v\n%s", m, err, out)
		}
	}
	for _, m := range []int{version.SupportedMinors[0] - 1, version.SupportedMinors[len(version.SupportedMinors)-1] + 1} {
		out, err := helm(t, "template", "gpu-scheduler", chart, "--namespace", "kube-system", "--kube-version", fmt.Sprintf("1.%d.0", m))
		if err == nil || !strings.Contains(out, "kubeVersion") {
			t.Errorf("1.%d: rendered (%v), want the chart's kubeVersion refusal:\n%.300s", m, err, out)
		}
	}
}
