package simulator

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Placement is where one pod of a replay went.
type Placement struct {
	Pod  string
	Node string
	// Devices are the device indices the pod holds (none for CPU-only
	// pods); Milli what it takes on each.
	Devices []int
	Milli   int
	// The pod's trace row: CPU, memory, GPU model constraint.
	CPUMilli  int64
	MemoryMiB int64
	GPUSpec   string
	// Arrival is the pod's index in the replay's arrival order.
	Arrival int
}

// Checker verifies a replay's placements as they are made, independently of
// the scheduler's own accounting: from the trace's rows and the devices each
// bound pod was given, no device holds more than a whole GPU, every node's
// CPU and memory stay within what it has, every model constraint holds, and
// at the end the allocated milli the metric reports is what the devices
// hold. A replay whose check fails is not a result.
type Checker struct {
	nodes map[string]*checkedNode
	// wholeOnly: the vanilla scheduler gives a share a whole device (the
	// trace row still counts its milli in the metric).
	wholeOnly bool
	devices   int64 // milli on the devices, summed as placed
	requested int64 // the trace rows' requests of the bound pods
	errs      []string
}

type checkedNode struct {
	row       NodeRow
	cpu, mem  int64
	free      []int
	wholeUsed int
}

// NewChecker starts from empty nodes. wholeOnly is for the vanilla
// scheduler, whose pods hold whole GPUs.
func NewChecker(nodes []NodeRow, wholeOnly bool) *Checker {
	c := &Checker{nodes: make(map[string]*checkedNode, len(nodes)), wholeOnly: wholeOnly}
	for _, n := range nodes {
		cn := &checkedNode{row: n, free: make([]int, n.GPUs)}
		for i := range cn.free {
			cn.free[i] = gpu.MilliPerGPU
		}
		c.nodes[n.Name] = cn
	}
	return c
}

func (c *Checker) fail(format string, args ...any) {
	if len(c.errs) < 20 {
		c.errs = append(c.errs, fmt.Sprintf(format, args...))
	}
}

// Add records a bound pod and checks its node at once.
func (c *Checker) Add(row PodRow, p Placement) {
	n := c.nodes[p.Node]
	if n == nil {
		c.fail("%s: bound to %q, which is not a node of the trace", row.Name, p.Node)
		return
	}
	n.cpu += row.CPUMilli
	n.mem += row.MemoryMiB
	if n.cpu > n.row.CPUMilli {
		c.fail("%s on %s: CPU %d of %d milli", row.Name, p.Node, n.cpu, n.row.CPUMilli)
	}
	if n.mem > n.row.MemoryMiB {
		c.fail("%s on %s: memory %d of %d MiB", row.Name, p.Node, n.mem, n.row.MemoryMiB)
	}
	c.requested += row.GPURequest()
	if row.NumGPU == 0 {
		if len(p.Devices) > 0 {
			c.fail("%s on %s: a CPU-only pod holds devices %v", row.Name, p.Node, p.Devices)
		}
		return
	}
	if len(row.Models) > 0 && !slices.Contains(row.Models, n.row.Model) {
		c.fail("%s on %s: model %q is not one of %v", row.Name, p.Node, n.row.Model, row.Models)
	}
	if c.wholeOnly {
		n.wholeUsed += row.NumGPU
		if n.wholeUsed > n.row.GPUs {
			c.fail("%s on %s: %d whole GPUs of %d", row.Name, p.Node, n.wholeUsed, n.row.GPUs)
		}
		return
	}
	if len(p.Devices) != row.NumGPU || p.Milli != row.GPUMilli {
		c.fail("%s on %s: holds %d devices of %d milli, asked for %d of %d", row.Name, p.Node, len(p.Devices), p.Milli, row.NumGPU, row.GPUMilli)
	}
	for _, d := range p.Devices {
		if d < 0 || d >= len(n.free) {
			c.fail("%s on %s: device %d of %d", row.Name, p.Node, d, len(n.free))
			continue
		}
		n.free[d] -= p.Milli
		c.devices += int64(p.Milli)
		if n.free[d] < 0 {
			c.fail("%s on %s: device %d holds %d milli", row.Name, p.Node, d, gpu.MilliPerGPU-n.free[d])
		}
	}
}

// Remove records that a bound pod left its node (the dynamic replay).
func (c *Checker) Remove(row PodRow, p Placement) {
	n := c.nodes[p.Node]
	if n == nil {
		return
	}
	n.cpu -= row.CPUMilli
	n.mem -= row.MemoryMiB
	c.requested -= row.GPURequest()
	if row.NumGPU == 0 {
		return
	}
	if c.wholeOnly {
		n.wholeUsed -= row.NumGPU
		return
	}
	for _, d := range p.Devices {
		if d >= 0 && d < len(n.free) {
			n.free[d] += p.Milli
			c.devices -= int64(p.Milli)
		}
	}
}

// Finish checks the reported allocated milli and returns every violation
// found (nil: the replay holds).
func (c *Checker) Finish(reportedAllocated int64) error {
	want := c.devices
	if c.wholeOnly {
		want = c.requested
	}
	if reportedAllocated != want || reportedAllocated != c.requested {
		c.fail("the metric reports %d milli allocated; the devices hold %d, the bound pods' rows ask for %d", reportedAllocated, want, c.requested)
	}
	if len(c.errs) == 0 {
		return nil
	}
	return fmt.Errorf("the replay's placements do not hold: %s", strings.Join(c.errs, "; "))
}

// placementOf reads where a bound pod went from its assignment annotation.
func placementOf(row PodRow, node string, annotations map[string]string, arrival int) Placement {
	p := Placement{Pod: row.Name, Node: node, CPUMilli: row.CPUMilli, MemoryMiB: row.MemoryMiB, GPUSpec: strings.Join(row.Models, "|"), Arrival: arrival}
	if a, err := gpu.ParseAssignment(annotations[gpu.AnnotationAssignment]); err == nil {
		for _, s := range a.Shares {
			p.Devices = append(p.Devices, s.Index)
			p.Milli = int(s.Milli)
		}
	}
	return p
}

// PlacementHeader is the placement log's header.
var PlacementHeader = []string{"pod", "node", "devices", "milli_per_device", "cpu_milli", "memory_mib", "gpu_spec", "arrival_index"}

// Record is the placement as a row of the placement log; devices are
// separated by '|'.
func (p *Placement) Record() []string {
	devs := make([]string, len(p.Devices))
	for i, d := range p.Devices {
		devs[i] = strconv.Itoa(d)
	}
	return []string{p.Pod, p.Node, strings.Join(devs, "|"), strconv.Itoa(p.Milli), strconv.FormatInt(p.CPUMilli, 10),
		strconv.FormatInt(p.MemoryMiB, 10), p.GPUSpec, strconv.Itoa(p.Arrival)}
}
