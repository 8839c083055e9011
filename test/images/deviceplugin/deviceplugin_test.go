package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// kubelet is the kubelet's registration service, on a socket in dir.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.got <- r
	return &pluginapi.Empty{}, nil
}

func serveKubelet(t *testing.T, dir string) *kubelet {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{got: make(chan *pluginapi.RegisterRequest, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return k
}

func (k *kubelet) registered(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.got:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register")
		return nil
	}
}

// The plugin registers with the kubelet, streams its devices (and their
// changes), answers Allocate per container through its function, and
// registers again when the kubelet restarts (which removes every socket).
func TestPlugin(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	k := serveKubelet(t, dir)
	var asked [][]string
	p := &Plugin{Resource: "example.com/gpu", Dir: dir, Socket: "p.sock",
		Container: func(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
			asked = append(asked, ids)
			return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DEVICES": ids[0]}}, nil
		}}
	p.SetDevices([]*pluginapi.Device{{ID: "a", Health: pluginapi.Healthy}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	r := k.registered(t)
	if r.ResourceName != "example.com/gpu" || r.Endpoint != "p.sock" || r.Version != pluginapi.Version || r.Options.GetPreferredAllocationAvailable {
		t.Fatalf("registration %+v", r)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "p.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pluginapi.NewDevicePluginClient(conn)
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := stream.Recv(); err != nil || len(got.Devices) != 1 || got.Devices[0].ID != "a" {
		t.Fatalf("devices %v %v", got, err)
	}
	p.SetDevices([]*pluginapi.Device{{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Unhealthy}})
	if got, err := stream.Recv(); err != nil || len(got.Devices) != 2 || got.Devices[1].Health != pluginapi.Unhealthy {
		t.Fatalf("devices after a change %v %v", got, err)
	}
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"a"}}, {DevicesIds: []string{"b"}}}})
	if err != nil || len(resp.ContainerResponses) != 2 || resp.ContainerResponses[1].Envs["DEVICES"] != "b" || len(asked) != 2 {
		t.Fatalf("allocate %v %v %v", resp, err, asked)
	}

	// The kubelet restarts: its restart removes the plugin's socket.
	os.Remove(filepath.Join(dir, "p.sock"))
	if r := k.registered(t); r.Endpoint != "p.sock" {
		t.Fatalf("registered again as %+v", r)
	}
	if _, err := os.Stat(filepath.Join(dir, "p.sock")); err != nil {
		t.Errorf("no socket after the restart: %v", err)
	}
}

// With a preference, the kubelet is told it may ask for one.
func TestPluginPreference(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	k := serveKubelet(t, dir)
	p := &Plugin{Resource: "example.com/gpu", Dir: dir, Socket: "p.sock",
		Prefer: func(available, must []string, size int) []string { return available[:size] }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	if r := k.registered(t); !r.Options.GetPreferredAllocationAvailable {
		t.Fatalf("registration %+v", r)
	}
	got, err := p.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"x", "y", "z"}, AllocationSize: 2}}})
	if err != nil || len(got.ContainerResponses[0].DeviceIDs) != 2 {
		t.Fatalf("preference %v %v", got, err)
	}
}
