// Package fakehami plays HAMi's device plugin (NVIDIA, hami-core mode) on
// fake nodes, for tests and make run: the registration annotation, and at
// each pod's admission the plugin's side of the handshake, call by call as
// the kubelet makes them (one per container that requests nvidia.com/gpu,
// init containers first). It is written from the protocol description
// (hami-protocol.md in the shared docs, sections 1 and 4), not from
// gpu-scheduler's encoder in pkg/agent/hami, so that it catches the
// scheduler's mistakes instead of repeating them: it finds the pod the way
// the plugin does (the lock's holder, or the first pending pod with the
// bind annotations), takes the first non-empty container entry, checks its
// device count against the container's request, and computes the
// environment HAMi-core would see. What the plugin would refuse fails the
// admission; the pod then fails as the kubelet fails it.
package fakehami

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The protocol's keys (hami-protocol.md section 0).
const (
	keyRegister   = "hami.io/node-nvidia-register"
	keyLock       = "hami.io/mutex.lock"
	keyNode       = "hami.io/vgpu-node"
	keyToAllocate = "hami.io/vgpu-devices-to-allocate"
	keyBindPhase  = "hami.io/bind-phase"
	keyBindTime   = "hami.io/bind-time"
	resourceGPU   = "nvidia.com/gpu"
)

// EnvPrefix is the pod annotation (one per container, EnvPrefix+name) where
// the fake records the environment the container got, so that tests and
// make run can show what the node enforces.
const EnvPrefix = "fake.hami.io/env."

// Device is one GPU of a fake node.
type Device struct {
	UUID    string
	Index   int
	MemMiB  int
	Cores   int
	Split   int
	Type    string
	Healthy bool
}

// Devices makes n devices for a node, with stable UUIDs.
func Devices(node string, n, memMiB, split int, model string) []Device {
	out := make([]Device, n)
	for i := range out {
		h := fnv.New64a()
		fmt.Fprintf(h, "%s/%d", node, i)
		s := fmt.Sprintf("%016x", h.Sum64())
		out[i] = Device{UUID: "GPU-" + s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + fmt.Sprintf("%04d", i) + "-" + s[:12],
			Index: i, MemMiB: memMiB, Cores: 100, Split: split, Type: "NVIDIA " + model, Healthy: true}
	}
	return out
}

// Register is the registration annotation's value, written as the plugin
// writes it: a JSON array, fields omitted when zero.
func Register(devs []Device) string {
	type entry struct {
		ID      string `json:"id,omitempty"`
		Index   int    `json:"index,omitempty"`
		Count   int    `json:"count,omitempty"`
		Devmem  int    `json:"devmem,omitempty"`
		Devcore int    `json:"devcore,omitempty"`
		Type    string `json:"type,omitempty"`
		Numa    int    `json:"numa,omitempty"`
		Mode    string `json:"mode,omitempty"`
		Health  bool   `json:"health,omitempty"`
	}
	es := make([]entry, len(devs))
	for i, d := range devs {
		es[i] = entry{ID: d.UUID, Index: d.Index, Count: d.Split, Devmem: d.MemMiB, Devcore: d.Cores, Type: d.Type, Mode: "hami-core", Health: d.Healthy}
	}
	b, _ := json.Marshal(es)
	return string(b)
}

// Plugin is the fake device plugin of every fake node that carries a
// registration. A node's admissions are served one at a time, as its plugin
// does; nodes are independent.
type Plugin struct {
	client kubernetes.Interface
	mu     sync.Mutex // admitted, nodes
	nodes  map[string]*sync.Mutex
	// admitted remembers each pod's admission: the kubelet admits a pod
	// once, however often its status write has to be retried.
	admitted map[types.UID]error
	// Allocations counts successful Allocate calls (tests).
	Allocations int
}

// New returns the plugin.
func New(client kubernetes.Interface) *Plugin {
	return &Plugin{client: client, admitted: map[types.UID]error{}, nodes: map[string]*sync.Mutex{}}
}

// Serves reports whether the plugin runs on the node.
func Serves(node *v1.Node) bool {
	_, ok := node.Annotations[keyRegister]
	return ok
}

// gpus is what a container asks of the device plugin (limits first).
func gpus(c *v1.Container) int64 {
	q, ok := c.Resources.Limits[resourceGPU]
	if !ok {
		q, ok = c.Resources.Requests[resourceGPU]
	}
	if !ok {
		return 0
	}
	n, _ := q.AsInt64()
	return n
}

// Admit is the kubelet's device admission of a pod on a node the plugin
// serves: one Allocate per container that requests nvidia.com/gpu. An error
// means the kubelet rejects the pod (UnexpectedAdmissionError).
func (p *Plugin) Admit(ctx context.Context, node *v1.Node, pod *v1.Pod) error {
	p.mu.Lock()
	nm := p.nodes[node.Name]
	if nm == nil {
		nm = &sync.Mutex{}
		p.nodes[node.Name] = nm
	}
	p.mu.Unlock()
	nm.Lock()
	defer nm.Unlock()
	p.mu.Lock()
	err, done := p.admitted[pod.UID]
	p.mu.Unlock()
	if done {
		return err
	}
	err = p.admit(ctx, node, pod)
	if ctx.Err() == nil {
		p.mu.Lock()
		p.admitted[pod.UID] = err
		p.mu.Unlock()
	}
	return err
}

func (p *Plugin) admit(ctx context.Context, node *v1.Node, pod *v1.Pod) error {
	envs := map[string]string{}
	cs := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range cs {
		n := gpus(&cs[i])
		if n <= 0 {
			continue
		}
		env, err := p.AllocateOn(ctx, node, int(n))
		if err != nil {
			return fmt.Errorf("Allocate for container %s: %w", cs[i].Name, err)
		}
		envs[cs[i].Name] = strings.Join(env, ";")
	}
	if len(envs) == 0 {
		return nil
	}
	// Where the environment went: the kubelet's pod, whatever pod the
	// devices came from (the plugin does not check they are the same).
	ann := map[string]any{}
	for c, e := range envs {
		ann[EnvPrefix+c] = e
	}
	return p.patchPod(ctx, pod, ann)
}

// AllocateOn is one Allocate call of the plugin on the node, for a container
// the kubelet gives ids devices: it serves the pod being bound there and
// returns the container's environment ("K=V"). On success it ends the bind
// once the pod's list is empty (bind phase success, lock released); on a
// failure after a pod was chosen it fails the bind (bind phase failed, lock
// released), as PodAllocationTrySuccess and PodAllocationFailed do.
func (p *Plugin) AllocateOn(ctx context.Context, node *v1.Node, ids int) ([]string, error) {
	devs, err := parseRegister(node.Annotations[keyRegister])
	if err != nil {
		return nil, err
	}
	target, env, err := p.allocate(ctx, node.Name, devs, ids)
	if err != nil {
		if target != nil {
			p.failed(ctx, node.Name, target)
		}
		return nil, err
	}
	cur, err := p.client.CoreV1().Pods(target.Namespace).Get(ctx, target.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if !strings.Contains(cur.Annotations[keyToAllocate], "NVIDIA") {
		if err := p.patchPod(ctx, cur, map[string]any{keyBindPhase: "success"}); err != nil {
			return nil, err
		}
		p.release(ctx, node.Name, cur)
	}
	return env, nil
}

// allocate is one Allocate call: find the pod, take its first non-empty
// container entry, check the count, write the rest back, and compute the
// environment.
func (p *Plugin) allocate(ctx context.Context, node string, devs map[string]Device, ids int) (*v1.Pod, []string, error) {
	target, err := p.pendingPod(ctx, node)
	if err != nil {
		return nil, nil, err
	}
	list, ok := target.Annotations[keyToAllocate]
	if !ok {
		return target, nil, fmt.Errorf("pod %s/%s has no %s", target.Namespace, target.Name, keyToAllocate)
	}
	segs, err := decode(list)
	if err != nil {
		return target, nil, err
	}
	at := -1
	for i, s := range segs {
		if len(s) > 0 {
			at = i
			break
		}
	}
	if at < 0 {
		return target, nil, fmt.Errorf("no device left to allocate for pod %s/%s", target.Namespace, target.Name)
	}
	seg := segs[at]
	if len(seg) != ids {
		return target, nil, fmt.Errorf("device number not matched: kubelet asked for %d, the pod's list has %d", ids, len(seg))
	}
	segs[at] = nil
	if err := p.patchPod(ctx, target, map[string]any{keyToAllocate: encode(segs)}); err != nil {
		return target, nil, err
	}
	var uuids []string
	env := []string{}
	seen := map[string]bool{}
	for i, d := range seg {
		if _, ok := devs[d.uuid]; !ok {
			return target, nil, fmt.Errorf("device %s is not on node %s", d.uuid, node)
		}
		if !seen[d.uuid] {
			seen[d.uuid] = true
			uuids = append(uuids, d.uuid)
		}
		env = append(env, fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d=%dm", i, d.mem))
	}
	env = append([]string{"NVIDIA_VISIBLE_DEVICES=" + strings.Join(uuids, ",")}, env...)
	env = append(env, "CUDA_DEVICE_SM_LIMIT="+strconv.Itoa(seg[0].cores))
	p.mu.Lock()
	p.Allocations++
	p.mu.Unlock()
	return target, env, nil
}

// pendingPod finds the pod being bound on the node as the plugin does: the
// lock's holder (whatever its state), or without a lock (or with a legacy
// one), the first pod on the node in list order that is Pending with a
// bind time, bind phase allocating or success, and the node named.
func (p *Plugin) pendingPod(ctx context.Context, node string) (*v1.Pod, error) {
	n, err := p.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if v, ok := n.Annotations[keyLock]; ok && strings.Contains(v, ",") {
		parts := strings.Split(v, ",")
		if len(parts) != 3 {
			return nil, fmt.Errorf("malformed lock %q", v)
		}
		if _, err := time.Parse(time.RFC3339, parts[0]); err != nil {
			return nil, fmt.Errorf("malformed lock %q: %w", v, err)
		}
		return p.client.CoreV1().Pods(parts[1]).Get(ctx, parts[2], metav1.GetOptions{})
	} else if ok {
		if _, err := time.Parse(time.RFC3339, v); err != nil {
			return nil, fmt.Errorf("malformed lock %q: %w", v, err)
		}
	}
	pods, err := p.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		q := &pods.Items[i]
		phase := q.Annotations[keyBindPhase]
		if _, timed := q.Annotations[keyBindTime]; q.Status.Phase == v1.PodPending && timed &&
			(phase == "allocating" || phase == "success") && q.Annotations[keyNode] == node {
			return q, nil
		}
	}
	return nil, fmt.Errorf("no binding pod found on node %s", node)
}

// failed is PodAllocationFailed: the bind phase says so, and the lock goes.
func (p *Plugin) failed(ctx context.Context, node string, pod *v1.Pod) {
	_ = p.patchPod(ctx, pod, map[string]any{keyBindPhase: "failed"})
	p.release(ctx, node, pod)
}

// release drops the lock if it names the pod (or names nobody), read again
// and retried on a conflict as HAMi's ReleaseNodeLock does (retry.OnError):
// the node changes under it all the time (status, other binds).
func (p *Plugin) release(ctx context.Context, node string, pod *v1.Pod) {
	for attempt := 0; attempt < 5; attempt++ {
		n, err := p.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return
		}
		v, ok := n.Annotations[keyLock]
		if !ok || (strings.Contains(v, ",") && !strings.HasSuffix(v, ","+pod.Namespace+","+pod.Name)) {
			return
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{keyLock: nil}, "resourceVersion": n.ResourceVersion}})
		if _, err := p.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsConflict(err) {
			return
		}
	}
}

func (p *Plugin) patchPod(ctx context.Context, pod *v1.Pod, ann map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	_, err = p.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("pod %s/%s is gone", pod.Namespace, pod.Name)
	}
	return err
}

type entry struct {
	uuid       string
	mem, cores int
}

// decode reads a device list (section 3): containers end in ';', devices in
// ':', each device "UUID,family,MiB,cores"; pieces without a comma are
// skipped, fewer than four fields is an error, numbers are int32.
func decode(s string) ([][]entry, error) {
	var out [][]entry
	for _, seg := range strings.Split(s, ";") {
		var ctr []entry
		for _, piece := range strings.Split(seg, ":") {
			if !strings.Contains(piece, ",") {
				continue
			}
			f := strings.Split(piece, ",")
			if len(f) < 4 {
				return nil, fmt.Errorf("pod annotation format error, missing fields in %q", piece)
			}
			// The family word, which the plugin looks for to know that
			// all containers were served; a model name here would break it.
			if f[1] != "NVIDIA" {
				return nil, fmt.Errorf("device %s: family %q, want NVIDIA", f[0], f[1])
			}
			mem, err := strconv.ParseInt(f[2], 10, 32)
			if err != nil {
				return nil, err
			}
			cores, err := strconv.ParseInt(f[3], 10, 32)
			if err != nil {
				return nil, err
			}
			ctr = append(ctr, entry{uuid: f[0], mem: int(mem), cores: int(cores)})
		}
		out = append(out, ctr)
	}
	return out, nil
}

func encode(segs [][]entry) string {
	var b strings.Builder
	for _, s := range segs {
		for _, d := range s {
			fmt.Fprintf(&b, "%s,NVIDIA,%d,%d:", d.uuid, d.mem, d.cores)
		}
		b.WriteString(";")
	}
	return b.String()
}

func parseRegister(v string) (map[string]Device, error) {
	var es []struct {
		ID      string `json:"id"`
		Devmem  int    `json:"devmem"`
		Devcore int    `json:"devcore"`
		Count   int    `json:"count"`
	}
	if err := json.Unmarshal([]byte(v), &es); err != nil {
		return nil, fmt.Errorf("registration: %w", err)
	}
	out := map[string]Device{}
	for _, e := range es {
		out[e.ID] = Device{UUID: e.ID, MemMiB: e.Devmem, Cores: e.Devcore, Split: e.Count}
	}
	return out, nil
}

// Env parses a recorded environment ("K=V;K=V").
func Env(v string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(v, ";") {
		if k, val, ok := strings.Cut(kv, "="); ok {
			out[k] = val
		}
	}
	return out
}
