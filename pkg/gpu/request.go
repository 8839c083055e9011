package gpu

import (
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Request is what one pod asks of the GPUs of a single node: either Count
// whole devices, or a share of one device (Milli, or MemoryMiB converted per
// node), restricted to the models Models allows. CPU is the pod's CPU request,
// which fragmentation needs.
type Request struct {
	Count     int32
	Milli     int32
	MemoryMiB int64
	Models    ModelSelector
	CPU       int64
	// Memory is the pod's memory request in MiB (for fragmentation).
	Memory int64

	// ShareCount devices each taking Share: a share in a node agent's own
	// request dialect (HAMi's nvidia.com/gpumem, gpumem-percentage,
	// gpucores), delivered only where that agent runs.
	ShareCount int32
	Share      DeviceShare
	// Slot is set when a share by annotation also requests the device
	// plugin's resource (one slot): an agent that enforces shares is then
	// asked for it and delivers it.
	Slot bool
	// NeedsDelivery places a share only where it is delivered and enforced
	// (the scheduler's default; the operator's accountingOnlySharing turns
	// it off, and a share is then accounted where nothing enforces it).
	NeedsDelivery bool
	// UUIDs restricts the devices by identity, where they are known.
	UUIDs UUIDSelector
	// ByClaim: the request is read from the pod's DRA claims, for
	// placement to score; DRA's allocator decides the fit and delivers it,
	// on nodes whose GPUs DRA publishes only.
	ByClaim bool
}

// HasGPU reports whether the pod uses any GPU.
func (r *Request) HasGPU() bool {
	return r.Count > 0 || r.Milli > 0 || r.MemoryMiB > 0 || r.ShareCount > 0
}

// Shared reports whether the pod asks for a share of a device.
func (r *Request) Shared() bool { return r.Milli > 0 || r.MemoryMiB > 0 || r.ShareCount > 0 }

// AgentShare is the request where an agent enforces shares: how many
// devices, each taking what. Whole GPUs take all of a device (exclusive, as
// HAMi's own scheduler defaults them); milli-GPU takes that much of its
// memory and cores (1% at least: 0 would leave the cores unthrottled); a
// share by memory takes that memory and no cores, like HAMi's gpumem.
func (r *Request) AgentShare() (int32, DeviceShare) {
	switch {
	case r.ShareCount > 0:
		return r.ShareCount, r.Share
	case r.Count > 0:
		return r.Count, Exclusive
	case r.Milli > 0:
		return 1, DeviceShare{Permille: r.Milli, Cores: max(1, r.Milli/10)}
	case r.MemoryMiB > 0:
		return 1, DeviceShare{MemoryMiB: r.MemoryMiB}
	}
	return 0, DeviceShare{}
}

// PerDevice returns how many devices the request takes on a node and how much
// of each, given the node's per-device memory. out is MemoryUnknown when a
// memory request meets a node that does not report its GPU memory, and
// ShareTooLarge when it asks for more than a device has; otherwise Fits, with
// 1 <= milli <= 1000 for every GPU request. Every operand is bounded (a
// request's memory and a node's by MaxGPUMemoryMiB), so nothing overflows,
// whatever the input.
func (r *Request) PerDevice(nodeMemoryMiB int64) (devices int32, milli int32, out Outcome) {
	switch {
	case r.Count > 0:
		return r.Count, MilliPerGPU, Fits
	case r.Milli > 0:
		if r.Milli > MilliPerGPU {
			return 1, 0, ShareTooLarge
		}
		return 1, r.Milli, Fits
	case r.ShareCount > 0:
		// Sized only per device, where an agent reports them.
		return r.ShareCount, 0, NoShareDelivery
	case r.MemoryMiB > 0:
		if nodeMemoryMiB <= 0 || nodeMemoryMiB > MaxGPUMemoryMiB {
			return 1, 0, MemoryUnknown
		}
		if r.MemoryMiB > nodeMemoryMiB {
			return 1, 0, ShareTooLarge
		}
		// Both at most 2^20 MiB: the product is below 2^30.
		return 1, int32((r.MemoryMiB*MilliPerGPU + nodeMemoryMiB - 1) / nodeMemoryMiB), Fits
	}
	return 0, 0, Fits
}

// TotalMilli is the request in milli-GPU where it does not depend on the node.
func (r *Request) TotalMilli() int64 {
	if r.Count > 0 {
		return int64(r.Count) * MilliPerGPU
	}
	return int64(r.Milli)
}

// ModelSelector restricts the GPU model. An empty selector allows any model.
type ModelSelector struct {
	// Exact product names, as in the node's product label.
	Exact []string
	// Include and Exclude are upper-cased substrings (HAMi semantics).
	Include []string
	Exclude []string
}

// Empty reports whether the selector allows every model.
func (s *ModelSelector) Empty() bool {
	return len(s.Exact) == 0 && len(s.Include) == 0 && len(s.Exclude) == 0
}

// Matches reports whether a node's model is allowed. modelFold is the model
// upper-cased, computed once per node so that this does not allocate.
func (s *ModelSelector) Matches(model, modelFold string) bool {
	if len(s.Exact) > 0 {
		found := false
		for _, m := range s.Exact {
			if m == model {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if len(s.Include) > 0 {
		found := false
		for _, sub := range s.Include {
			if modelFold != "" && strings.Contains(modelFold, sub) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	for _, sub := range s.Exclude {
		if modelFold != "" && strings.Contains(modelFold, sub) {
			return false
		}
	}
	return true
}

// String renders the selector for messages and workload keys.
func (s *ModelSelector) String() string {
	var parts []string
	if len(s.Exact) > 0 {
		parts = append(parts, strings.Join(s.Exact, "|"))
	}
	if len(s.Include) > 0 {
		parts = append(parts, "~"+strings.Join(s.Include, ","))
	}
	if len(s.Exclude) > 0 {
		parts = append(parts, "!"+strings.Join(s.Exclude, ","))
	}
	return strings.Join(parts, ";")
}

// InvalidError says which annotation is wrong and which rule it broke. The
// plugins turn it into UnschedulableAndUnresolvable.
type InvalidError struct {
	Key   string
	Value string
	Rule  string
	// Resource is set when Key is a container resource, not an annotation.
	Resource bool
}

func (e *InvalidError) Error() string {
	if e.Resource {
		return fmt.Sprintf("invalid resource %s=%q: %s", e.Key, e.Value, e.Rule)
	}
	return fmt.Sprintf("invalid annotation %s=%q: %s", e.Key, e.Value, e.Rule)
}

// RequestOptions name the extended resources that count as whole GPUs, and
// the node agent whose request dialect is read too.
type RequestOptions struct {
	ResourceNames []v1.ResourceName
	Agent         Agent
	// NeedsDelivery: shares go only where they are delivered (see
	// Request.NeedsDelivery).
	NeedsDelivery bool
}

// DefaultRequestOptions uses nvidia.com/gpu.
var DefaultRequestOptions = RequestOptions{ResourceNames: []v1.ResourceName{ResourceNvidiaGPU}}

// UsesGPU is a cheap test that a pod asks for no device at all (no GPU
// resource, no shared-GPU annotation), so that rebuilding a node's device
// state skips parsing its CPU pods in full.
func UsesGPU(pod *v1.Pod, opts RequestOptions) bool {
	for _, key := range sharedKeys {
		if _, ok := pod.Annotations[key]; ok {
			return true
		}
	}
	has := func(cs []v1.Container) bool {
		for i := range cs {
			for _, name := range opts.ResourceNames {
				if _, ok := cs[i].Resources.Requests[name]; ok {
					return true
				}
				if _, ok := cs[i].Resources.Limits[name]; ok {
					return true
				}
			}
		}
		return false
	}
	return has(pod.Spec.Containers) || has(pod.Spec.InitContainers)
}

var sharedKeys = [...]string{AnnotationMilli, AnnotationKAIFraction, AnnotationMemory, AnnotationKAIMemory}

// ParseRequest reads a pod's GPU request. Invalid input returns an
// *InvalidError; it is never ignored.
func ParseRequest(pod *v1.Pod, opts RequestOptions) (Request, error) {
	r, err := parseGPURequest(pod, opts)
	if err != nil {
		return Request{}, err
	}
	r.CPU = min(podRequest(pod, v1.ResourceCPU, true), maxCPUMilli)
	r.Memory = min(podRequest(pod, v1.ResourceMemory, true)>>20, maxMemoryMiB)
	r.NeedsDelivery = opts.NeedsDelivery
	return r, nil
}

// parseGPURequest is ParseRequest without CPU and memory: what the device
// accounting needs of every GPU pod on a node.
func parseGPURequest(pod *v1.Pod, opts RequestOptions) (Request, error) {
	var r Request
	var whole int64
	var wholeName v1.ResourceName
	for _, name := range opts.ResourceNames {
		if n := podRequest(pod, name, false); n > 0 {
			whole = addSat(whole, n)
			wholeName = name
		}
	}
	// More than any node tracks fits nowhere (TooFewDevices says why).
	r.Count = int32(min(whole, MaxDevices+1))

	dialect := false
	if opts.Agent != nil {
		n, sh, ok, err := opts.Agent.Share(pod)
		if err != nil {
			return Request{}, err
		}
		if ok {
			dialect = true
			if sh == Exclusive {
				r.Count = n // all of each device: whole GPUs
			} else {
				r.Count, r.ShareCount, r.Share = 0, n, sh
			}
		}
	}

	a := pod.Annotations
	shared := ""
	for _, key := range sharedKeys {
		v, ok := a[key]
		if !ok {
			continue
		}
		if shared != "" {
			return Request{}, &InvalidError{Key: key, Value: v, Rule: "conflicts with " + shared + ": set only one shared-GPU request"}
		}
		shared = key
		if dialect {
			return Request{}, &InvalidError{Key: key, Value: v, Rule: "conflicts with the share requested by " + opts.Agent.AgentName() +
				" resources (nvidia.com/gpumem, gpumem-percentage, gpucores): ask for a share one way"}
		}
		if r.Count > 0 {
			if whole != 1 {
				return Request{}, &InvalidError{Key: key, Value: v, Rule: fmt.Sprintf(
					"a shared GPU takes one slot of the device plugin: request %s: 1 (delivered by a device plugin that enforces shares) or none (accounting only), not %d", wholeName, whole)}
			}
			r.Count, r.Slot = 0, true
		}
		var err error
		switch key {
		case AnnotationMilli:
			r.Milli, err = parseMilli(key, v)
		case AnnotationKAIFraction:
			r.Milli, err = parseFraction(key, v)
		default:
			r.MemoryMiB, err = parseMemoryMiB(key, v)
		}
		if err != nil {
			return Request{}, err
		}
	}
	if v, ok := a[AnnotationKAIFractionNumDevices]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		switch {
		case err != nil || n < 1:
			return Request{}, &InvalidError{Key: AnnotationKAIFractionNumDevices, Value: v, Rule: "must be a positive integer"}
		case n > 1:
			return Request{}, &InvalidError{Key: AnnotationKAIFractionNumDevices, Value: v, Rule: "a fraction of more than one device is not supported; request whole GPUs instead"}
		case r.Milli == 0 || shared != AnnotationKAIFraction:
			return Request{}, &InvalidError{Key: AnnotationKAIFractionNumDevices, Value: v, Rule: "needs " + AnnotationKAIFraction}
		}
	}

	if v, ok := a[AnnotationModel]; ok {
		if _, hami := a[AnnotationHAMiUseType]; hami {
			return Request{}, &InvalidError{Key: AnnotationModel, Value: v, Rule: "conflicts with " + AnnotationHAMiUseType + ": use one model selector"}
		}
		r.Models.Exact = splitList(v, "|,", false)
		if len(r.Models.Exact) == 0 {
			return Request{}, &InvalidError{Key: AnnotationModel, Value: v, Rule: "must list at least one GPU model, separated by '|'"}
		}
	}
	if v, ok := a[AnnotationHAMiUseType]; ok {
		r.Models.Include = splitList(v, ",", true)
		if len(r.Models.Include) == 0 {
			return Request{}, &InvalidError{Key: AnnotationHAMiUseType, Value: v, Rule: "must list at least one GPU type, separated by ','"}
		}
	}
	if v, ok := a[AnnotationHAMiNoUseType]; ok {
		r.Models.Exclude = splitList(v, ",", true)
		if len(r.Models.Exclude) == 0 {
			return Request{}, &InvalidError{Key: AnnotationHAMiNoUseType, Value: v, Rule: "must list at least one GPU type, separated by ','"}
		}
	}
	if v, ok := a[AnnotationHAMiUseUUID]; ok {
		r.UUIDs.Use = splitList(v, ",", false)
	}
	if v, ok := a[AnnotationHAMiNoUseUUID]; ok {
		r.UUIDs.NoUse = splitList(v, ",", false)
	}
	if !r.Models.Empty() && !r.HasGPU() {
		key, v := modelKey(a)
		return Request{}, &InvalidError{Key: key, Value: v, Rule: "a GPU model constraint needs a GPU request (" + string(firstName(opts)) + " or " + AnnotationMilli + ")"}
	}
	return r, nil
}

func modelKey(a map[string]string) (string, string) {
	for _, k := range []string{AnnotationModel, AnnotationHAMiUseType, AnnotationHAMiNoUseType} {
		if v, ok := a[k]; ok {
			return k, v
		}
	}
	return "", ""
}

func firstName(opts RequestOptions) v1.ResourceName {
	if len(opts.ResourceNames) == 0 {
		return ResourceNvidiaGPU
	}
	return opts.ResourceNames[0]
}

func parseMilli(key, v string) (int32, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
	if err != nil || n < 1 || n >= MilliPerGPU {
		return 0, &InvalidError{Key: key, Value: v, Rule: "must be an integer from 1 to 999 (milli-GPU of one device); use " + ResourceNvidiaGPU + " for whole GPUs"}
	}
	return int32(n), nil
}

func parseFraction(key, v string) (int32, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	// NaN fails every comparison, so test for the valid range.
	if err != nil || !(f > 0 && f < 1) {
		return 0, &InvalidError{Key: key, Value: v, Rule: "must be a decimal fraction greater than 0 and less than 1"}
	}
	m := int32(f*MilliPerGPU + 0.5)
	if m < 1 || m >= MilliPerGPU {
		return 0, &InvalidError{Key: key, Value: v, Rule: "rounds to " + strconv.Itoa(int(m)) + " milli-GPU; it must be from 1 to 999"}
	}
	return m, nil
}

// maxMemoryQuantity is MaxGPUMemoryMiB as a quantity.
var maxMemoryQuantity = *resource.NewQuantity(MaxGPUMemoryMiB<<20, resource.BinarySI)

func parseMemoryMiB(key, v string) (int64, error) {
	invalid := &InvalidError{Key: key, Value: v, Rule: "must be a positive amount of GPU memory per device, in MiB up to " +
		strconv.Itoa(MaxGPUMemoryMiB) + " (1 TiB) or a quantity such as 8Gi"}
	s := strings.TrimSpace(v)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 1 || n > MaxGPUMemoryMiB {
			return 0, invalid
		}
		return n, nil
	}
	// Only plain quantities (8Gi, 80G, 1.5Ti): the quantity parser takes
	// exponents too, and with one like 9e-23372036854775807 it does not
	// return. A tenant writes this string.
	if !plainQuantity(s) {
		return 0, invalid
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 || q.Cmp(maxMemoryQuantity) > 0 {
		return 0, invalid
	}
	const mib = 1 << 20
	return (q.Value() + mib - 1) / mib, nil
}

// plainQuantity accepts decimal digits, at most one '.', and an optional
// binary or decimal suffix, in at most 24 bytes.
func plainQuantity(s string) bool {
	if len(s) == 0 || len(s) > 24 {
		return false
	}
	i, dot, digits := 0, false, 0
	for ; i < len(s); i++ {
		c := s[i]
		if c >= '0' && c <= '9' {
			digits++
			continue
		}
		if c == '.' && !dot {
			dot = true
			continue
		}
		break
	}
	if digits == 0 {
		return false
	}
	switch s[i:] {
	case "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E":
		return true
	}
	return false
}

func splitList(v, seps string, fold bool) []string {
	var out []string
	for _, p := range strings.FieldsFunc(v, func(r rune) bool { return strings.ContainsRune(seps, r) }) {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if fold {
			p = strings.ToUpper(p)
		}
		out = append(out, p)
	}
	return out
}

// SameRequestAnnotations reports whether two versions of a pod carry the same
// request annotations.
func SameRequestAnnotations(a, b *v1.Pod) bool {
	for _, k := range RequestAnnotations {
		va, oka := a.Annotations[k]
		vb, okb := b.Annotations[k]
		if oka != okb || va != vb {
			return false
		}
	}
	return true
}

// WholeGPUs is the pod's request of whole-GPU resources, without parsing
// annotations or allocating.
func WholeGPUs(pod *v1.Pod, opts RequestOptions) int64 {
	var n int64
	for _, name := range opts.ResourceNames {
		n = addSat(n, podRequest(pod, name, false))
	}
	return n
}

// maxQuantity bounds every resource value read from a pod, so that sums
// over containers stay inside int64 (addSat saturates there).
const maxQuantity = 1 << 60

// addSat adds two values in [0, maxQuantity], saturating at maxQuantity.
func addSat(a, b int64) int64 {
	return min(a+b, maxQuantity)
}

// podRequest is the effective request of one resource, as the scheduler
// computes it: regular containers and sidecars run together, other init
// containers run one at a time before them. For CPU, pod-level resources and
// overhead count too.
func podRequest(pod *v1.Pod, name v1.ResourceName, withPodLevel bool) int64 {
	value := func(l v1.ResourceList) int64 {
		q, ok := l[name]
		if !ok || q.Sign() <= 0 {
			return 0
		}
		var v int64
		if name == v1.ResourceCPU {
			v = q.MilliValue()
		} else {
			v = q.Value()
		}
		// Huge quantities saturate (or wrap) in MilliValue; clamp them.
		if v < 0 || v > maxQuantity {
			return maxQuantity
		}
		return v
	}
	if withPodLevel && pod.Spec.Resources != nil {
		if _, ok := pod.Spec.Resources.Requests[name]; ok {
			return addSat(value(pod.Spec.Resources.Requests), value(pod.Spec.Overhead))
		}
	}
	var sum, sidecars, initMax int64
	for i := range pod.Spec.Containers {
		sum = addSat(sum, value(pod.Spec.Containers[i].Resources.Requests))
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		v := value(c.Resources.Requests)
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			sidecars = addSat(sidecars, v)
			continue
		}
		initMax = max(initMax, addSat(v, sidecars))
	}
	total := max(addSat(sum, sidecars), initMax)
	if withPodLevel {
		total = addSat(total, value(pod.Spec.Overhead))
	}
	return total
}
