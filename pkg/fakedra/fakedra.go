// Package fakedra is a fake DRA driver for the local control plane and the
// tests: it publishes a node's GPUs in a ResourceSlice as NVIDIA's GPU
// driver does (whole GPUs, one device each) or as HAMi's does (each GPU
// shared by consumable capacity: cores and memory), and installs their
// DeviceClasses. Like the fake kubelet, it runs nothing on a node: the
// scheduler's side of DRA (slices, classes, claims) is what it serves.
package fakedra

import (
	"context"
	"fmt"
	"strconv"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Driver styles.
const (
	NVIDIA = "nvidia"
	HAMi   = "hami"
)

// DriverName is the style's driver.
func DriverName(style string) string {
	if style == HAMi {
		return dra.HAMi.Name
	}
	return dra.NVIDIA.Name
}

// SliceName is the name of a node's slice.
func SliceName(node, style string) string { return "fakedra-" + style + "-" + node }

// UUID is the identity of a node's GPU i.
func UUID(node string, i int) string { return fmt.Sprintf("GPU-fakedra-%s-%d", node, i) }

// Slice publishes gpus devices of the model on node; the last unhealthy
// ones carry the taint NVIDIA's health check gives a lost GPU.
func Slice(node, style string, gpus, unhealthy int, model string, memMiB int) *resourceapi.ResourceSlice {
	driver := DriverName(style)
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: SliceName(node, style)},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}},
	}
	mem := resource.NewQuantity(int64(memMiB)<<20, resource.BinarySI)
	for i := 0; i < gpus; i++ {
		d := resourceapi.Device{
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid":        {StringValue: ptr.To(UUID(node, i))},
				"productName": {StringValue: ptr.To(model)},
				"brand":       {StringValue: ptr.To("Nvidia")},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: *mem}},
		}
		if style == HAMi {
			d.Name = "hami-gpu-" + strconv.Itoa(i)
			d.Attributes["type"] = resourceapi.DeviceAttribute{StringValue: ptr.To(dra.HAMi.GPUType)}
			d.AllowMultipleAllocations = ptr.To(true)
			d.Capacity["cores"] = resourceapi.DeviceCapacity{Value: resource.MustParse("100"),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("100")),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("0")), Max: ptr.To(resource.MustParse("100")), Step: ptr.To(resource.MustParse("1"))}}}
			d.Capacity["memory"] = resourceapi.DeviceCapacity{Value: *mem,
				RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: mem,
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Mi")), Max: mem, Step: ptr.To(resource.MustParse("1Mi"))}}}
		} else {
			d.Name = "gpu-" + strconv.Itoa(i)
			d.Attributes["type"] = resourceapi.DeviceAttribute{StringValue: ptr.To(dra.NVIDIA.GPUType)}
		}
		if i >= gpus-unhealthy {
			d.Taints = []resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/gpu-lost", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
		s.Spec.Devices = append(s.Spec.Devices, d)
	}
	return s
}

// DeviceClasses are the drivers' classes as their charts install them.
// NVIDIA's maps the extended resource nvidia.com/gpu (where the node's
// allocatable does not have it, DRA serves it); HAMi's (HAMi-DRA's own)
// maps none: two classes for one name would be ambiguous.
func DeviceClasses() []*resourceapi.DeviceClass {
	sel := func(driver, typ string) []resourceapi.DeviceSelector {
		return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q && device.attributes[%q].type == %q", driver, driver, typ)}}}
	}
	return []*resourceapi.DeviceClass{
		{ObjectMeta: metav1.ObjectMeta{Name: dra.NVIDIA.Name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: sel(dra.NVIDIA.Name, dra.NVIDIA.GPUType), ExtendedResourceName: ptr.To(string(gpu.ResourceNvidiaGPU))}},
		{ObjectMeta: metav1.ObjectMeta{Name: dra.HAMi.Name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: sel(dra.HAMi.Name, dra.HAMi.GPUType)}},
	}
}

// InstallClasses creates (or replaces) the DeviceClasses.
func InstallClasses(ctx context.Context, client kubernetes.Interface) error {
	for _, c := range DeviceClasses() {
		if err := apply(ctx, client, c); err != nil {
			return err
		}
	}
	return nil
}

func apply(ctx context.Context, client kubernetes.Interface, c *resourceapi.DeviceClass) error {
	_, err := client.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := client.ResourceV1().DeviceClasses().Get(ctx, c.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		c.ResourceVersion = cur.ResourceVersion
		_, err = client.ResourceV1().DeviceClasses().Update(ctx, c, metav1.UpdateOptions{})
	}
	return err
}

// Publish creates or replaces a node's slice, owned by the node (deleted
// with it where the garbage collector runs).
func Publish(ctx context.Context, client kubernetes.Interface, node *v1.Node, s *resourceapi.ResourceSlice) error {
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
	_, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := client.ResourceV1().ResourceSlices().Get(ctx, s.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		s.ResourceVersion = cur.ResourceVersion
		s.Spec.Pool.Generation = cur.Spec.Pool.Generation + 1
		_, err = client.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("publishing %s: %w", s.Name, err)
	}
	return nil
}

// Unpublish deletes a node's slices of both styles.
func Unpublish(ctx context.Context, client kubernetes.Interface, node string) error {
	for _, style := range []string{NVIDIA, HAMi} {
		err := client.ResourceV1().ResourceSlices().Delete(ctx, SliceName(node, style), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}
