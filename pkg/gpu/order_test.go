package gpu

import (
	"slices"
	"testing"
)

// DeviceOrder puts the most used device first (best fit for an allocator
// that takes the first that fits), equal ones by index, and devices that
// take nothing last; FirstFit takes the first devices that fit in an order.
func TestDeviceOrderAndFirstFit(t *testing.T) {
	devs := []Device{
		{UUID: "a", MemoryMiB: 16000, Cores: 100, Slots: 8, Healthy: true},
		{UUID: "b", MemoryMiB: 16000, Cores: 100, Slots: 8, Healthy: true},
		{UUID: "c", MemoryMiB: 16000, Cores: 100, Slots: 8, Healthy: false},
		{UUID: "d", MemoryMiB: 16000, Cores: 100, Slots: 8, Healthy: true},
		{UUID: "e", MemoryMiB: 16000, Cores: 100, Slots: 8, Healthy: true},
	}
	st := NewNodeState("n", readAgentInventory(devs, "test"), 0)
	st.TakeUses([]DeviceUse{{UUID: "b", MemoryMiB: 4000, Cores: 30, Slots: 1}, {UUID: "d", MemoryMiB: 12000, Cores: 70, Slots: 1}})
	rank := st.DeviceOrder(nil)
	order := make([]int, len(rank))
	for i, r := range rank {
		order[r] = i
	}
	if want := []int{3, 1, 0, 4, 2}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v (d most used, then b, the free ones by index, the unhealthy one last)", order, want)
	}
	share := &Request{Milli: 250, Slot: true}
	for _, tc := range []struct {
		name string
		r    *Request
		rank []int
		want []int
	}{
		{"first fit in index order: the first free device", share, nil, []int{0}},
		{"our order: beside the most used that fits", share, rank, []int{3}},
		{"a share too big for d: b", &Request{Milli: 500, Slot: true}, rank, []int{1}},
		{"whole GPUs: the free ones, in order", &Request{Count: 2}, rank, []int{0, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := st.FirstFit(tc.r, tc.rank)
			if !ok {
				t.Fatal("does not fit")
			}
			if got := c.Devices(); !slices.Equal(got, tc.want) {
				t.Errorf("devices %v, want %v", got, tc.want)
			}
		})
	}
	if _, ok := st.FirstFit(&Request{Count: 4}, rank); ok {
		t.Error("four whole GPUs fit where two are free")
	}
}
