package offline_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes/fake"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	configv1 "k8s.io/kubernetes/pkg/scheduler/apis/config/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
)

// The reference scenario, through the whole shipped profile. prefix renames
// the nodes, which changes their order for ties.
func referenceCluster(prefix string) ([]*v1.Node, []*v1.Pod) {
	gpuTaint := v1.Taint{Key: "gpu", Value: "true", Effect: v1.TaintEffectNoSchedule}
	notReady := v1.Taint{Key: v1.TaintNodeNotReady, Effect: v1.TaintEffectNoSchedule}
	res := func(cpu, mem, gpus string) map[v1.ResourceName]string {
		r := map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem}
		if gpus != "" {
			r[gpu.ResourceNvidiaGPU] = gpus
		}
		return r
	}
	gpuNode := func(name, cpu string) *st.NodeWrapper {
		return st.MakeNode().Name(prefix+name).Capacity(res(cpu, "64Gi", "4")).Label("accelerator", "gpu").
			Label(gpu.LabelGPUProduct, "NVIDIA-A100-SXM4-80GB").Label(gpu.LabelGPUMemory, "81920").Taints([]v1.Taint{gpuTaint})
	}
	nodes := []*v1.Node{
		gpuNode("node-1", "2").Obj(),
		st.MakeNode().Name(prefix + "node-2").Capacity(res("16", "64Gi", "")).Obj(),
		gpuNode("node-3", "16").Obj(),
		gpuNode("node-4", "16").Obj(),
		gpuNode("node-5", "16").Taints([]v1.Taint{gpuTaint, notReady}).Condition(v1.NodeReady, v1.ConditionFalse, "", "KubeletNotReady").Obj(),
	}
	// node-3 has 70% of its memory requested, node-4 30%.
	pods := []*v1.Pod{
		st.MakePod().Name("mem70").Namespace("default").UID("mem70").Node(prefix + "node-3").Req(map[v1.ResourceName]string{v1.ResourceMemory: "44.8Gi"}).Obj(),
		st.MakePod().Name("mem30").Namespace("default").UID("mem30").Node(prefix + "node-4").Req(map[v1.ResourceName]string{v1.ResourceMemory: "19.2Gi"}).Obj(),
	}
	return nodes, pods
}

func referencePod(gpus string) *v1.Pod {
	req := map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi"}
	if gpus != "" {
		req[gpu.ResourceNvidiaGPU] = gpus
	}
	return st.MakePod().Name("ref").Namespace("default").UID("ref").SchedulerName(gpu.SchedulerName).
		NodeSelector(map[string]string{"accelerator": "gpu"}).
		Tolerations([]v1.Toleration{{Key: "gpu", Operator: v1.TolerationOpEqual, Value: "true", Effect: v1.TaintEffectNoSchedule}}).
		Req(req).Obj()
}

func shippedFramework(t *testing.T, nodes []*v1.Node, pods []*v1.Pod) (context.Context, *offline.Cluster, framework.Framework) {
	t.Helper()
	return shippedFrameworkWith(t, nodes, pods, fake.NewClientset(), nil, offline.Options{})
}

// shippedFrameworkWith is shippedFramework with a client, a change to the
// profile (nil: none) and options (out-of-tree plugins).
func shippedFrameworkWith(t *testing.T, nodes []*v1.Node, pods []*v1.Pod, client *fake.Clientset, edit func(*config.KubeSchedulerProfile), opts offline.Options) (context.Context, *offline.Cluster, framework.Framework) {
	t.Helper()
	tCtx := ktesting.Init(t)
	cfg, err := offline.LoadConfig(manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := offline.Profile(cfg, gpu.SchedulerName)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(prof)
	}
	cluster, err := offline.NewCluster(nodes, pods)
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := offline.NewFramework(tCtx, prof, cluster, client, opts)
	if err != nil {
		t.Fatal(err)
	}
	return tCtx, cluster, f
}

func TestReferenceScenario(t *testing.T) {
	// With the prefix "b-", node-3 comes before node-4 in the node order
	// (without it, after): the choice must not depend on it.
	for _, prefix := range []string{"", "b-"} {
		wantRejected := map[string]string{
			prefix + "node-1": "Insufficient cpu",
			prefix + "node-2": "node(s) didn't match Pod's node affinity/selector",
			prefix + "node-5": "node(s) had untolerated taint(s)",
		}
		for _, gpus := range []string{"", "1"} {
			t.Run(prefix+"gpus="+gpus, func(t *testing.T) {
				nodes, pods := referenceCluster(prefix)
				ctx, cluster, f := shippedFramework(t, nodes, pods)
				if gpus == "" {
					// The GPU variant has been seen before: its kind is in
					// the learned workload, and 16Gi more on node-3 would
					// leave too little memory for it. (With only CPU pods
					// known, GPU nodes that tie go by the node order.)
					learn := referencePod("1")
					learn.UID = "ref-gpu"
					offline.Schedule(ctx, f, cluster, learn)
				}
				res := offline.Schedule(ctx, f, cluster, referencePod(gpus))
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				if res.Node != prefix+"node-4" {
					t.Errorf("want %snode-4, got %s (scores %+v)", prefix, res.Node, res.Scores)
				}
				got := map[string]string{}
				for n, s := range res.Rejected {
					got[n] = strings.Join(s.Reasons(), "; ")
				}
				if diff := cmp.Diff(wantRejected, got); diff != "" {
					t.Errorf("per-node reasons (-want,+got):\n%s", diff)
				}
				var s3, s4 int64
				for _, s := range res.Scores {
					switch s.Name {
					case prefix + "node-3":
						s3 = s.TotalScore
					case prefix + "node-4":
						s4 = s.TotalScore
					}
				}
				if s4 <= s3 {
					t.Errorf("node-4 (30%% memory) must score above node-3 (70%%): %d <= %d", s4, s3)
				}
			})
		}
	}
}

// A pod nothing can take gets the aggregated message a user sees in
// FailedScheduling.
func TestReferenceScenarioImpossible(t *testing.T) {
	common := []string{
		"0/5 nodes are available:",
		"1 Insufficient cpu",
		"1 node(s) didn't match Pod's node affinity/selector",
		"1 node(s) had untolerated taint(s)",
	}
	tests := map[string]struct {
		pod  *v1.Pod
		want string
	}{
		// Counting whole GPUs is the in-tree fit's job; it answers first.
		"too many GPUs": {referencePod("8"), "3 Insufficient nvidia.com/gpu"},
		// No node has the model: answered once, before any filter runs.
		"model":         {withAnnotation(referencePod("1"), gpu.AnnotationModel, "H100-80GB-HBM3"), "0/5 nodes are available: node(s) had no GPU, node(s) had no allowed GPU model."},
		"share too big": {withAnnotation(referencePod(""), gpu.AnnotationMemory, "90000"), "2 node(s) had no device plugin that delivers GPU shares"},
		// Nothing delivers a share on these nodes (no HAMi device plugin).
		"share": {withAnnotation(referencePod("1"), gpu.AnnotationMilli, "500"), "2 node(s) had no device plugin that delivers GPU shares"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			nodes, pods := referenceCluster("")
			ctx, cluster, f := shippedFramework(t, nodes, pods)
			res := offline.Schedule(ctx, f, cluster, tc.pod)
			if res.Err == nil {
				t.Fatalf("want a fit error, got %s", res.Node)
			}
			msg := res.Err.Error()
			wants := append(common, tc.want)
			if name == "model" {
				wants = []string{tc.want}
			}
			for _, want := range wants {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q lacks %q", msg, want)
				}
			}
		})
	}
}

func withAnnotation(p *v1.Pod, k, v string) *v1.Pod {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[k] = v
	return p
}

func TestShippedConfig(t *testing.T) {
	cfg, err := offline.LoadConfig(manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LeaderElection.ResourceName != "gpu-scheduler" || !cfg.LeaderElection.LeaderElect {
		t.Errorf("leader election must use our own lease: %+v", cfg.LeaderElection)
	}
	prof, err := offline.Profile(cfg, gpu.SchedulerName)
	if err != nil {
		t.Fatal(err)
	}
	var fit *ourconfig.GPUFitArgs
	var score *ourconfig.GPUScoreArgs
	for _, pc := range prof.PluginConfig {
		switch a := pc.Args.(type) {
		case *ourconfig.GPUFitArgs:
			fit = a
		case *ourconfig.GPUScoreArgs:
			score = a
		}
	}
	if fit == nil || score == nil {
		t.Fatalf("args are not typed: %+v", prof.PluginConfig)
	}
	// Set in the file, and defaulted where the file is silent.
	if fit.GPUProductLabel != gpu.LabelGPUProduct || fit.Requeue.ResyncPeriodSeconds != 30 || fit.Requeue.BackoffMaxSeconds != 1000 {
		t.Errorf("GPUFit args: %+v", fit)
	}
	if score.Policy != "Fragmentation" || score.TargetWorkload.Mode != "Learned" {
		t.Errorf("GPUScore args: %+v", score)
	}
	// GPUFit binds GPU pods (assignment in the binding) before the default binder.
	var binders []string
	for _, p := range prof.Plugins.Bind.Enabled {
		binders = append(binders, p.Name)
	}
	if strings.Join(binders, ",") != "GPUFit,DefaultBinder" || fit.AssignmentWrite != "Bind" {
		t.Errorf("bind order %v, assignmentWrite %q", binders, fit.AssignmentWrite)
	}

	// Round trip: encode to v1 YAML, decode again, same configuration.
	enc := kubeschedulerscheme.Codecs.EncoderForVersion(json.NewYAMLSerializer(json.DefaultMetaFactory, kubeschedulerscheme.Scheme, kubeschedulerscheme.Scheme), configv1.SchemeGroupVersion)
	var buf strings.Builder
	if err := enc.Encode(cfg, writer{&buf}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: GPUFitArgs", "kind: GPUScoreArgs", "resyncPeriodSeconds: 30", "policy: Fragmentation"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("encoded config lacks %q:\n%s", want, buf.String())
		}
	}
	again, err := offline.LoadConfig([]byte(buf.String()))
	if err != nil {
		t.Fatalf("decoding the encoded config: %v\n%s", err, buf.String())
	}
	if diff := cmp.Diff(cfg, again); diff != "" {
		t.Errorf("round trip (-want,+got):\n%s", diff)
	}
}

func TestConfigErrors(t *testing.T) {
	base := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: gpu-scheduler
  plugins:
    multiPoint:
      enabled:
      - name: GPUFit
      - name: GPUScore
`
	// No pluginConfig: typed args with defaults are filled in.
	cfg, err := offline.LoadConfig([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, pc := range cfg.Profiles[0].PluginConfig {
		switch pc.Args.(type) {
		case *ourconfig.GPUFitArgs, *ourconfig.GPUScoreArgs:
			found++
		}
	}
	if found != 2 {
		t.Errorf("default args not filled: %+v", cfg.Profiles[0].PluginConfig)
	}

	// Unknown fields are rejected, not ignored.
	_, err = offline.LoadConfig([]byte(base + `  pluginConfig:
  - name: GPUScore
    args:
      polcy: Spread
`))
	if err == nil || !strings.Contains(err.Error(), `unknown field "polcy"`) {
		t.Errorf("want a strict decoding error, got %v", err)
	}

	// Invalid values fail when the plugin is built, as at startup.
	bad := base + `  pluginConfig:
  - name: GPUScore
    args:
      policy: Random
`
	cfg, err = offline.LoadConfig([]byte(bad))
	if err != nil {
		t.Fatal(err)
	}
	tCtx := ktesting.Init(t)
	cluster, _ := offline.NewCluster(nil, nil)
	_, _, err = offline.NewFramework(tCtx, &cfg.Profiles[0], cluster, fake.NewClientset(), offline.Options{})
	if err == nil || !strings.Contains(err.Error(), `args.policy: Unsupported value: "Random"`) {
		t.Errorf("want the plugin to refuse the args, got %v", err)
	}
}

type writer struct{ b *strings.Builder }

func (w writer) Write(p []byte) (int, error) { return w.b.Write(p) }

// The shipped profile filters in upstream's order up to NodeResourcesFit,
// with NodeResourcesFitFast in its place (a node that fails several filters
// is reported by the same one as in the vanilla scheduler), with and
// without the gate that adds DeferredPodScheduling before it.
func TestShippedFilterOrder(t *testing.T) {
	filters := func(t *testing.T, data []byte, profile string) []string {
		cfg, err := offline.LoadConfig(data)
		if err != nil {
			t.Fatal(err)
		}
		prof, err := offline.Profile(cfg, profile)
		if err != nil {
			t.Fatal(err)
		}
		cluster, err := offline.NewCluster(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		f, _, err := offline.NewFramework(ktesting.Init(t), prof, cluster, fake.NewClientset(), offline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range f.ListPlugins().Filter.Enabled {
			names = append(names, p.Name)
		}
		return names
	}
	upTo := func(names []string, last string) []string {
		i := slices.Index(names, last)
		if i < 0 {
			t.Fatalf("%s is not a filter: %v", last, names)
		}
		return names[:i]
	}
	for _, gate := range []bool{false, true} {
		t.Run(fmt.Sprintf("InPlacePodVerticalScalingSchedulerPreemption=%v", gate), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.InPlacePodVerticalScalingSchedulerPreemption, gate)
			vanilla := filters(t, []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"), "default-scheduler")
			ours := filters(t, manifests.SchedulerConfig, gpu.SchedulerName)
			if slices.Contains(ours, "NodeResourcesFit") {
				t.Errorf("NodeResourcesFit filters beside NodeResourcesFitFast: %v", ours)
			}
			want, got := upTo(vanilla, "NodeResourcesFit"), upTo(ours, "NodeResourcesFitFast")
			if gate != slices.Contains(want, "DeferredPodScheduling") {
				t.Fatalf("upstream's filters before NodeResourcesFit: %v (gate %v)", want, gate)
			}
			if !slices.Equal(got, want) {
				t.Errorf("filters before NodeResourcesFitFast %v, upstream's before NodeResourcesFit %v\nall: %v", got, want, ours)
			}
		})
	}
}
