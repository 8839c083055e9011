package integration

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakedra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/kubectlgpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// kubectl gpu nodes shows a node whose GPUs only DRA publishes, with its
// devices by UUID and model from the slice, and the claims on each.
func TestKubectlGPUShowsDRA(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "dra", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "NVIDIA-H200", MemoryMiB: 143771, DRA: fakedra.NVIDIA})
	node := s.Node("dra")
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: s.NS, Name: "train"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: fakedra.DriverName(fakedra.NVIDIA), AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}}
	c, err := cluster.Client.ResourceV1().ResourceClaims(s.NS).Create(s.Ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{NodeSelector: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}},
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: fakedra.DriverName(fakedra.NVIDIA), Pool: node, Device: "gpu-1"}}}}
	if _, err := cluster.Client.ResourceV1().ResourceClaims(s.NS).UpdateStatus(s.Ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(harness.BinDir(), "kubectl-gpu"), "--kubeconfig", cluster.Kubeconfig, "-l", harness.LabelScope+"="+s.ID, "nodes", "-o", "json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl gpu nodes: %v: %s", err, errb.String())
	}
	var r kubectlgpu.NodesReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Nodes) != 1 || r.Nodes[0].Name != node || r.Nodes[0].Agent != "DRA" || len(r.Nodes[0].Devices) != 2 {
		t.Fatalf("nodes: %s", out.String())
	}
	devs := r.Nodes[0].Devices
	if devs[1].UUID != fakedra.UUID(node, 1) || devs[1].Model != "NVIDIA-H200" || devs[1].AllocatedMilli != 1000 ||
		!slices.ContainsFunc(devs[1].Pods, func(p string) bool { return strings.HasPrefix(p, s.NS+"/train") }) {
		t.Errorf("gpu-1 as shown: %+v", devs[1])
	}
	if devs[0].AllocatedMilli != 0 {
		t.Errorf("gpu-0 as shown: %+v", devs[0])
	}
}
