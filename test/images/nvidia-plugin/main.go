// Command nvidia-plugin is a device plugin in the manner of NVIDIA's, for
// kind nodes without GPUs: it advertises whole GPUs as nvidia.com/gpu,
// named by UUID, and lets the kubelet choose which ones a container gets
// (NVIDIA's plugin prefers devices by NVLink topology; with none, this one
// offers no preference unless -prefer lowest). Each container is told its
// devices in NVIDIA_VISIBLE_DEVICES, as the real plugin's default envvar
// strategy does. With -labels it also writes the GPU Feature Discovery
// labels a GPU node carries (product, memory, count).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
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

func main() {
	var (
		n      = flag.Int("gpus", 4, "GPUs to advertise")
		model  = flag.String("model", "NVIDIA-A100-SXM4-80GB", "GPU model (GFD product label)")
		memory = flag.Int("memory", 81920, "MiB per GPU (GFD memory label)")
		labels = flag.Bool("labels", true, "write GFD's labels on the node")
		prefer = flag.String("prefer", "none", "GetPreferredAllocation: none (the kubelet picks) or lowest (lowest UUIDs first)")
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

	devs := fakehami.Devices(node, *n, *memory, 1, *model)
	p := &deviceplugin.Plugin{Resource: gpu.ResourceNvidiaGPU, Dir: *dir, Socket: "nvidia-gpu.sock",
		Container: func(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
			ids = append([]string(nil), ids...)
			sort.Strings(ids)
			return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")}}, nil
		}}
	switch *prefer {
	case "none":
	case "lowest":
		p.Prefer = lowest
	default:
		klog.Fatalf("-prefer %q: want none or lowest", *prefer)
	}
	var ds []*pluginapi.Device
	for _, d := range devs {
		ds = append(ds, &pluginapi.Device{ID: d.UUID, Health: pluginapi.Healthy})
	}
	p.SetDevices(ds)
	if *labels {
		go keepLabels(ctx, node, map[string]string{
			gpu.LabelGPUProduct:      *model,
			gpu.LabelGPUMemory:       strconv.Itoa(*memory),
			"nvidia.com/gpu.count":   strconv.Itoa(*n),
			"nvidia.com/gpu.present": "true",
		})
	}
	if err := p.Run(ctx); err != nil {
		klog.Fatal(err)
	}
}

// lowest prefers the must-include devices, then the lowest IDs.
func lowest(available, must []string, size int) []string {
	out := append([]string(nil), must...)
	in := map[string]bool{}
	for _, id := range must {
		in[id] = true
	}
	rest := append([]string(nil), available...)
	sort.Strings(rest)
	for _, id := range rest {
		if len(out) >= size {
			break
		}
		if !in[id] {
			out = append(out, id)
		}
	}
	return out
}

// keepLabels writes the labels on the node, and again every 30 s if someone
// removed them, as GFD relabels.
func keepLabels(ctx context.Context, node string, labels map[string]string) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		klog.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			same := true
			for k, v := range labels {
				same = same && n.Labels[k] == v
			}
			if !same {
				_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
			}
		}
		if err != nil {
			klog.ErrorS(err, "Labelling the node", "node", node)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
	}
}
