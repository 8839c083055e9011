// Command hami-plugin plays HAMi's NVIDIA device plugin (hami-core mode) on
// a kind node without GPUs, as a real device plugin the kubelet calls. It
// registers nvidia.com/gpu with split slots per GPU (IDs <UUID>-<i>), writes
// the node's registration annotation, and on each Allocate does what HAMi's
// plugin does (pkg/fakehami, written from the protocol description): it
// finds the pod being bound on the node (the lock's holder, or the first
// pending pod with the bind annotations), takes the pod's next container
// entry from hami.io/vgpu-devices-to-allocate, answers with the devices'
// UUIDs and HAMi-core's memory and SM limits, and ends the bind (bind phase
// success or failed, the node lock released). The kubelet's choice of slots
// is ignored, as HAMi ignores it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakehami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/images/deviceplugin"
)

const annotationRegister = "hami.io/node-nvidia-register"

func main() {
	var (
		n      = flag.Int("gpus", 4, "GPUs to register")
		model  = flag.String("model", "NVIDIA-L4", "GPU model, as GFD's product label names it")
		memory = flag.Int("memory", 23034, "MiB per GPU (devmem)")
		split  = flag.Int("split", 10, "deviceSplitCount: slots per GPU")
		labels = flag.Bool("labels", true, "also write GFD's labels on the node, as GFD does beside HAMi")
		delay  = flag.Duration("register-delay", 0, "wait this long after registering with the kubelet before writing the registration annotation")
		dir    = flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	)
	klog.InitFlags(nil)
	flag.Parse()
	node := os.Getenv("NODE_NAME")
	if node == "" {
		klog.Fatal("NODE_NAME is not set")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := rest.InClusterConfig()
	if err != nil {
		klog.Fatal(err)
	}
	// client-go's default of 5 requests a second would be the bottleneck:
	// each Allocate makes about seven.
	cfg.QPS, cfg.Burst = 50, 100
	client := kubernetes.NewForConfigOrDie(cfg)
	hami := fakehami.New(client)

	devs := fakehami.Devices(node, *n, *memory, *split, strings.TrimPrefix(*model, "NVIDIA-"))
	var mu sync.Mutex // HAMi's plugin serves one Allocate at a time
	p := &deviceplugin.Plugin{Resource: gpu.ResourceNvidiaGPU, Dir: *dir, Socket: "hami-nvidia.sock",
		Container: func(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
			called := time.Now()
			mu.Lock()
			defer mu.Unlock()
			nd, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			env, err := hami.AllocateOn(ctx, nd, len(ids))
			if err != nil {
				return nil, err
			}
			out := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
			for _, kv := range env {
				if k, v, ok := strings.Cut(kv, "="); ok {
					out.Envs[k] = v
				}
			}
			klog.InfoS("Allocated", "devices", out.Envs["NVIDIA_VISIBLE_DEVICES"], "slots", ids, "called", called.Format(time.RFC3339Nano), "took", time.Since(called))
			return out, nil
		}}
	var ds []*pluginapi.Device
	for _, d := range devs {
		for i := 0; i < d.Split; i++ {
			ds = append(ds, &pluginapi.Device{ID: fmt.Sprintf("%s-%d", d.UUID, i), Health: pluginapi.Healthy})
		}
	}
	p.SetDevices(ds)
	want := map[string]string{}
	if *labels {
		want[gpu.LabelGPUProduct] = *model
		want[gpu.LabelGPUMemory] = strconv.Itoa(*memory)
		want["nvidia.com/gpu.count"] = strconv.Itoa(*n)
		want["nvidia.com/gpu.present"] = "true"
	}
	// GFD's labels come from GFD, not from the plugin: at once. The
	// registration after -register-delay (HAMi's plugin registers with the
	// kubelet first, then writes it).
	go keep(ctx, client, node, nil, want)
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(*delay):
		}
		keep(ctx, client, node, map[string]string{annotationRegister: fakehami.Register(devs)}, nil)
	}()
	if err := p.Run(ctx); err != nil {
		klog.Fatal(err)
	}
}

// keep writes the annotations and labels on the node, and again every
// 30 s if they changed, as the plugin's rescan (and GFD) do.
func keep(ctx context.Context, client kubernetes.Interface, node string, annotations, labels map[string]string) {
	if len(annotations)+len(labels) == 0 {
		return
	}
	// Only the keys given: a null map in a merge patch would remove all
	// of the node's annotations or labels.
	meta := map[string]any{}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	patch, _ := json.Marshal(map[string]any{"metadata": meta})
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			same := true
			for k, v := range annotations {
				same = same && n.Annotations[k] == v
			}
			for k, v := range labels {
				same = same && n.Labels[k] == v
			}
			if !same {
				_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
				if err == nil {
					klog.InfoS("Wrote the node's registration or labels", "node", node, "annotations", len(annotations), "labels", len(labels))
				}
			}
		}
		if err != nil {
			klog.ErrorS(err, "Writing the node's registration or labels", "node", node)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
	}
}
