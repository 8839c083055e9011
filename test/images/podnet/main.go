// Command podnet gives a kind cluster pod networking between its nodes, in
// place of kindnet (which cannot be built from the module proxy): on its
// node it writes a CNI configuration of the standard bridge and host-local
// plugins (Debian's containernetworking-plugins, in the node image) for the
// node's pod CIDR, and it keeps a route to every other node's pod CIDR via
// that node's address. It runs as a DaemonSet on the host network, and
// reconciles the whole state on every node event and every 30 s.
package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

const confFile = "/etc/cni/net.d/10-podnet.conflist"

// The bridge is the pods' gateway; traffic between nodes is routed, not
// masqueraded, so pods see each other's addresses.
const conflist = `{
  "cniVersion": "0.4.0",
  "name": "podnet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

func main() {
	klog.InitFlags(nil)
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
	client := kubernetes.NewForConfigOrDie(cfg)
	f := informers.NewSharedInformerFactory(client, 30*time.Second)
	inf := f.Core().V1().Nodes()
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	routed := map[string]bool{}
	for {
		nodes, _ := inf.Lister().List(labels.Everything())
		if err := reconcile(node, nodes, routed); err != nil {
			klog.ErrorS(err, "Reconciling the pod network")
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-time.After(30 * time.Second):
		}
	}
}

// reconcile writes this node's CNI configuration and routes to the other
// nodes' pod CIDRs; routed holds the destinations it routed before, so that
// a node's removal removes its route.
func reconcile(self string, nodes []*v1.Node, routed map[string]bool) error {
	want := map[string]net.IP{}
	for _, n := range nodes {
		if n.Name == self {
			if n.Spec.PodCIDR == "" {
				return fmt.Errorf("node %s has no pod CIDR yet", self)
			}
			if err := writeConf(fmt.Sprintf(conflist, n.Spec.PodCIDR)); err != nil {
				return err
			}
			continue
		}
		ip := internalIP(n)
		if ip == nil {
			continue
		}
		for _, c := range n.Spec.PodCIDRs {
			want[c] = ip
		}
	}
	var errs []error
	for c, gw := range want {
		_, dst, err := net.ParseCIDR(c)
		if err != nil || dst.IP.To4() == nil {
			continue
		}
		if err := netlink.RouteReplace(&netlink.Route{Dst: dst, Gw: gw}); err != nil {
			errs = append(errs, fmt.Errorf("route %s via %s: %w", c, gw, err))
			continue
		}
		if !routed[c] {
			klog.InfoS("Routed", "podCIDR", c, "via", gw)
		}
		routed[c] = true
	}
	for c := range routed {
		if _, ok := want[c]; ok {
			continue
		}
		_, dst, _ := net.ParseCIDR(c)
		if err := netlink.RouteDel(&netlink.Route{Dst: dst}); err != nil {
			errs = append(errs, err)
		}
		delete(routed, c)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%v", errs)
	}
	return nil
}

func internalIP(n *v1.Node) net.IP {
	for _, a := range n.Status.Addresses {
		if a.Type == v1.NodeInternalIP {
			if ip := net.ParseIP(a.Address); ip != nil && ip.To4() != nil {
				return ip
			}
		}
	}
	return nil
}

// writeConf replaces the configuration atomically, and only when it
// changed, so that the runtime never reads half a file.
func writeConf(content string) error {
	if old, err := os.ReadFile(confFile); err == nil && bytes.Equal(old, []byte(content)) {
		return nil
	}
	tmp := filepath.Join(filepath.Dir(confFile), ".podnet.tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	klog.InfoS("Writing the CNI configuration", "file", confFile)
	return os.Rename(tmp, confFile)
}
