package hami

import (
	"fmt"
	"strconv"
	"strings"
)

// ContainerDevice is one device of a container's list: the GPU by UUID, the
// memory in MiB and the cores in percent the container may use on it.
type ContainerDevice struct {
	UUID      string
	Type      string
	Usedmem   int32
	Usedcores int32
}

// ContainerDevices are one container's devices.
type ContainerDevices []ContainerDevice

// PodDevices are a pod's devices, one entry per container: init containers
// first, then app containers, each in spec order; GPU-less containers have
// an empty entry.
type PodDevices []ContainerDevices

// EncodeContainerDevices renders `UUID,type,mem,cores:` per device.
func EncodeContainerDevices(cd ContainerDevices) string {
	var b strings.Builder
	for _, d := range cd {
		b.WriteString(d.UUID)
		b.WriteByte(',')
		b.WriteString(d.Type)
		b.WriteByte(',')
		b.WriteString(strconv.Itoa(int(d.Usedmem)))
		b.WriteByte(',')
		b.WriteString(strconv.Itoa(int(d.Usedcores)))
		b.WriteString(deviceSep)
	}
	return b.String()
}

// EncodePodDevices renders each container's devices followed by ';'.
func EncodePodDevices(pd PodDevices) string {
	var b strings.Builder
	for _, cd := range pd {
		b.WriteString(EncodeContainerDevices(cd))
		b.WriteString(containerSep)
	}
	return b.String()
}

// DecodeContainerDevices reads one container's devices as HAMi's plugin
// does: pieces split on ':', those without a comma skipped, at least four
// fields each (more are ignored), memory and cores int32.
func DecodeContainerDevices(s string) (ContainerDevices, error) {
	out := ContainerDevices{}
	if s == "" {
		return out, nil
	}
	for _, piece := range strings.Split(s, deviceSep) {
		if !strings.Contains(piece, ",") {
			continue
		}
		f := strings.Split(piece, ",")
		if len(f) < 4 {
			return nil, fmt.Errorf("pod annotation format error, missing fields in %q", piece)
		}
		mem, err := parseInt32("memory", f[2])
		if err != nil {
			return nil, err
		}
		cores, err := parseInt32("core", f[3])
		if err != nil {
			return nil, err
		}
		out = append(out, ContainerDevice{UUID: f[0], Type: f[1], Usedmem: mem, Usedcores: cores})
	}
	return out, nil
}

// DecodePodDevices splits on ';' and decodes each container. The trailing
// ';' gives one more, empty, entry: entries keep the containers' positions.
func DecodePodDevices(s string) (PodDevices, error) {
	var out PodDevices
	for _, seg := range strings.Split(s, containerSep) {
		cd, err := DecodeContainerDevices(seg)
		if err != nil {
			return nil, err
		}
		out = append(out, cd)
	}
	return out, nil
}

// PopNextContainerDevices is what the plugin does at each Allocate: it takes
// the first non-empty container entry, empties it, and returns it with the
// list re-encoded (which gains one ';' per call, as HAMi's does).
func PopNextContainerDevices(s string) (ContainerDevices, string, error) {
	pd, err := DecodePodDevices(s)
	if err != nil {
		return nil, "", err
	}
	for i, cd := range pd {
		if len(cd) > 0 {
			pd[i] = nil
			return cd, EncodePodDevices(pd), nil
		}
	}
	return nil, "", fmt.Errorf("no device left to allocate in %q", s)
}
