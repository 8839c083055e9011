package gpu

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// LookupAt serves a node's state through the caller's key only while it is
// the state Lookup by name would serve: for the caller's generation, and
// with no change of the node's holds since. Every step checks both.
func TestLookupAt(t *testing.T) {
	tr := NewTracker(DefaultNodeOptions)
	na, nb := node("a", 4, 4, nil), node("b", 4, 4, nil)
	const keyA, keyB, keyC = uintptr(0x1000), uintptr(0x2040), uintptr(0x3080)
	build := func(n *v1.Node, gen int64, key uintptr, pods ...*v1.Pod) *NodeState {
		st := tr.Build(n, gen, pods, 8000, 8000)
		tr.Remember(key, n.Name)
		return st
	}
	// same checks LookupAt against Lookup by name, and against want.
	same := func(step string, key uintptr, name string, gen int64, want *NodeState) {
		t.Helper()
		got, byName := tr.LookupAt(key, gen), tr.Lookup(name, gen)
		if got != want {
			t.Errorf("%s: LookupAt = %p, want %p", step, got, want)
		}
		if got != nil && got != byName {
			t.Errorf("%s: LookupAt served %p where Lookup by name serves %p", step, got, byName)
		}
	}

	st := build(na, 5, keyA)
	same("built", keyA, "a", 5, st)
	same("another generation", keyA, "a", 6, nil)
	same("no key", 0, "a", 5, nil)
	same("an unknown key", keyB, "a", 5, nil)

	tr.Reserve("a", "r1", Reservation{Choice: Choice{Mask: 1, Milli: MilliPerGPU}, Since: time.Now()})
	same("a reservation since", keyA, "a", 5, nil)
	st = build(na, 5, keyA)
	same("rebuilt with it", keyA, "a", 5, st)
	if st.Free[0] != 0 {
		t.Fatalf("the rebuilt state does not hold the reservation: free %v", st.Free[:st.Count])
	}
	tr.Unreserve("r1")
	same("unreserved", keyA, "a", 5, nil)
	st = build(na, 5, keyA)

	// A state replaced by a newer build is never served again, even
	// through a key that still leads to it and with no change since.
	old := st
	tr.Remember(keyC, "a") // keyC: a clone of the node's view, same generation
	same("a second key", keyC, "a", 5, old)
	st = build(na, 7, keyA)
	same("the node changed", keyA, "a", 7, st)
	same("the replaced state through the other key", keyC, "a", 5, nil)

	// A key reused for another node: the entry leads to b's state, whose
	// generation is not a's.
	stB := build(nb, 9, keyA)
	same("the key now b's", keyA, "b", 9, stB)
	same("a's generation through b's entry", keyA, "a", 7, nil)

	// An entry torn between two writers: a's key with b's state.
	e := &tr.fast.Load().bucket(keyB)[0]
	e.key.Store(keyB)
	e.st.Store(stB)
	same("a torn entry", keyB, "a", 7, nil)

	// Holds of a nominee, and the node's removal.
	st = build(na, 7, keyA)
	tr.Nominate("n1", "a", Choice{Mask: 2, Milli: MilliPerGPU})
	same("a nomination since", keyA, "a", 7, nil)
	st = build(na, 7, keyA)
	same("rebuilt with the nomination", keyA, "a", 7, st)
	tr.ForgetNode("a")
	if got := tr.LookupAt(keyA, 7); got != nil {
		t.Errorf("a deleted node's state served: %p", got)
	}

	// The table grows with the nodes and starts empty: keys miss once,
	// then lead again.
	before := tr.fast.Load()
	var last *NodeState
	for i := range 2000 {
		last = build(node(fmt.Sprint("n-", i), 1, 1, nil), int64(100+i), uintptr(0x10000+i))
	}
	if tr.fast.Load() == before || len(tr.fast.Load().b) < 2000 {
		t.Fatalf("the table did not grow: %d buckets for 2000 nodes", len(tr.fast.Load().b))
	}
	same("after growing", uintptr(0x10000+1999), "n-1999", 2099, last)
	// Nodes are served through their keys: keys that share a bucket do not
	// evict each other (a direct-mapped table of 4 entries per node left a
	// fifth of the keys sharing an entry, each a miss every time).
	// The keys at random, as NodeInfos in spans scattered over the heap
	// (a regular progression of keys hashes without a collision).
	rnd := rand.New(rand.NewPCG(1, 2))
	keys := make([]uintptr, 2000)
	for i := range keys {
		keys[i] = uintptr(rnd.Uint64()>>24) | 1
		tr.Build(node(fmt.Sprint("n-", i), 1, 1, nil), int64(100+i), nil, 8000, 8000)
		tr.Remember(keys[i], fmt.Sprint("n-", i))
	}
	missed := 0
	for i, k := range keys {
		if tr.LookupAt(k, int64(100+i)) == nil {
			missed++
		}
	}
	if missed > 2000/200 {
		t.Errorf("%d of 2000 nodes not served through their keys, want at most 0.5%%", missed)
	}
}

// Concurrent builds, reservations and lookups: under -race, and every state
// served through a key holds every reservation made before the lookup
// began, as one read by name does.
func TestLookupAtConcurrent(t *testing.T) {
	tr := NewTracker(DefaultNodeOptions)
	n := node("a", 8, 8, nil)
	const key = uintptr(0x4000)
	tr.Build(n, 1, nil, 8000, 8000)
	tr.Remember(key, "a")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				st := tr.LookupAt(key, 1)
				if st == nil {
					st = tr.Build(n, 1, nil, 8000, 8000)
					tr.Remember(key, "a")
				}
				_ = st.Idle()
				_ = w
			}
		}()
	}
	for i := range 2000 {
		uid := types.UID(fmt.Sprint("r", i))
		tr.Reserve("a", uid, Reservation{Choice: Choice{Mask: 1 << uint(i%8), Milli: 100}, Since: time.Now()})
		// Reserved before this lookup began: a state served now holds it.
		if st := tr.LookupAt(key, 1); st != nil && st.Free[i%8] == MilliPerGPU {
			t.Fatalf("step %d: a state without the reservation served after it", i)
		}
		tr.Unreserve(uid)
		if st := tr.LookupAt(key, 1); st != nil && st.Free[i%8] != MilliPerGPU {
			t.Fatalf("step %d: a state with a released reservation served after the release", i)
		}
	}
	close(stop)
	wg.Wait()
}
