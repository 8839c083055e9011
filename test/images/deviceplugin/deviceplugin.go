// Package deviceplugin serves a kubelet device plugin (the v1beta1 gRPC API)
// for the test images of make e2e-kind: it registers with the kubelet,
// streams the device list, answers Allocate through the caller's function,
// and registers again whenever the kubelet restarts (which removes every
// socket in the plugin directory). What a container gets is the caller's
// business; this package is only the kubelet's side of the contract.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// AllocateFunc answers one container's Allocate: the device IDs the kubelet
// chose for it.
type AllocateFunc func(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error)

// PreferFunc is GetPreferredAllocation for one container; nil means the
// plugin offers no preference and the kubelet picks.
type PreferFunc func(available, mustInclude []string, size int) []string

// Plugin is one resource's device plugin.
type Plugin struct {
	// Resource is the extended resource name (nvidia.com/gpu).
	Resource string
	// Dir is the kubelet's device-plugin directory (the kubelet hard-codes
	// /var/lib/kubelet/device-plugins; tests use a temporary one).
	Dir string
	// Socket is this plugin's socket file name in Dir.
	Socket string
	// Container answers each container's Allocate.
	Container AllocateFunc
	Prefer    PreferFunc

	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{} // closed and replaced when devices change

	pluginapi.UnimplementedDevicePluginServer
}

// SetDevices replaces the advertised devices; open ListAndWatch streams
// send the new list.
func (p *Plugin) SetDevices(ds []*pluginapi.Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = ds
	if p.changed != nil {
		close(p.changed)
	}
	p.changed = make(chan struct{})
}

func (p *Plugin) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.devices, p.changed
}

// GetDevicePluginOptions implements the device plugin API.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: p.Prefer != nil}, nil
}

// ListAndWatch implements the device plugin API.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		ds, changed := p.snapshot()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: ds}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-s.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation implements the device plugin API.
func (p *Plugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	out := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		var ids []string
		if p.Prefer != nil {
			ids = p.Prefer(c.AvailableDeviceIDs, c.MustIncludeDeviceIDs, int(c.AllocationSize))
		}
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return out, nil
}

// Allocate implements the device plugin API: the kubelet sends one request
// per container.
func (p *Plugin) Allocate(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		resp, err := p.Container(ctx, c.DevicesIds)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Allocate failed", "devices", c.DevicesIds)
			return nil, err
		}
		out.ContainerResponses = append(out.ContainerResponses, resp)
	}
	return out, nil
}

// PreStartContainer implements the device plugin API (not requested).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Run serves until ctx ends, registering with the kubelet and registering
// again after every kubelet restart.
func (p *Plugin) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if p.Dir == "" {
		p.Dir = pluginapi.DevicePluginPath
	}
	for {
		err := p.serveOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		logger.Info("Serving again", "reason", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// serveOnce serves on a fresh socket, registers, and returns when the
// socket is removed (the kubelet restarted) or ctx ends.
func (p *Plugin) serveOnce(ctx context.Context) error {
	sock := filepath.Join(p.Dir, p.Socket)
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	defer srv.Stop()
	if err := p.register(ctx); err != nil {
		return fmt.Errorf("registering with the kubelet: %w", err)
	}
	klog.FromContext(ctx).Info("Registered with the kubelet", "resource", p.Resource, "socket", sock)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			return err
		case <-t.C:
			if _, err := os.Stat(sock); err != nil {
				return errors.New("socket removed: the kubelet restarted")
			}
		}
	}
}

func (p *Plugin) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.Dir, filepath.Base(pluginapi.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.Socket,
		ResourceName: p.Resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: p.Prefer != nil},
	}, grpc.WaitForReady(true))
	return err
}
