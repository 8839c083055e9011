package simulator

import (
	"fmt"
	"math/rand"
	"sort"
)

// Arrival is one experiment's input: the pods in submission order, and the
// nodes in tie-break order (the scheduler prefers the first of equal nodes).
type Arrival struct {
	Pods  []PodRow
	Nodes []NodeRow
	// Originals is how many of Pods are trace pods; the rest are clones
	// (tune up) — or fewer trace pods survived (tune down).
	Originals int
	// Target is the tuned GPU request (tune × capacity) and Requested what
	// the pods ask for in all.
	Target, Requested int64
}

// NewArrival follows the published method (openb-benchmark.md §3) with Go's
// math/rand seeded as the original simulator seeds its global source, so the
// order of pods and nodes is the original's:
//  1. W is the trace sorted by name (the pool clones come from);
//  2. one Int() is drawn and dropped, as the original's debug log does;
//  3. the pods, sorted by name, are shuffled;
//  4. tune up: clones drawn uniformly from W are appended while the running
//     request plus the clone's per-device milli stays within the target (the
//     original tests m, not m·k); tune down: random pods are removed while
//     the request exceeds the target;
//  5. ten values are drawn and dropped: the original starts its scheduler's
//     informers between the tuning and the ranking, and each of their ten
//     reflectors draws its watch timeout from the same global source
//     (client-go's reflector, rand.Float64). It always ranks after all
//     ten: it waits for the caches (polling every 100 ms), each reflector
//     draws as it starts its watch, and the fake clientset's watches never
//     time out, so none draws again;
//  6. the nodes, sorted by name, get a random rank (Perm): ties between
//     nodes go to the lowest rank, as the original's renamed nodes do.
//
// Checked against the original built here (its commit 8f3d641, default, seed
// 42): the same pods in the same order, and every renamed node its log names
// (TestArrivalMatchesOriginal).
func NewArrival(t *Trace, seed int64, tune float64) (*Arrival, error) {
	if tune <= 0 {
		return nil, fmt.Errorf("tune must be positive, got %v", tune)
	}
	r := rand.New(rand.NewSource(seed))
	w := append([]PodRow(nil), t.Pods...)
	sort.SliceStable(w, func(i, j int) bool { return w[i].Name < w[j].Name })
	r.Int()
	pods := append([]PodRow(nil), w...)
	r.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })

	var requested int64
	for i := range pods {
		requested += pods[i].GPURequest()
	}
	target := int64(tune * float64(t.Capacity()))
	a := &Arrival{Originals: len(pods), Target: target}
	if requested < target {
		for i := 0; ; i++ {
			c := w[r.Intn(len(w))]
			if requested+int64(c.GPUMilli) > target {
				break
			}
			c.Name = fmt.Sprintf("%s-tuned-%d", c.Name, i)
			requested += c.GPURequest()
			pods = append(pods, c)
			if i > 10*len(w)+1_000_000 {
				return nil, fmt.Errorf("tune up does not converge (no GPU pods in the trace?)")
			}
		}
	} else {
		for requested > target && len(pods) > 0 {
			i := r.Intn(len(pods))
			requested -= pods[i].GPURequest()
			pods = append(pods[:i], pods[i+1:]...)
			a.Originals--
		}
	}
	a.Pods, a.Requested = pods, requested

	for range originalInformers {
		r.Int63()
	}
	a.Nodes = rankNodes(r, t.Nodes)
	return a, nil
}

// originalInformers is how many reflectors the original's scheduler starts
// before it ranks the nodes (step 5 of NewArrival).
const originalInformers = 10

// rankNodes is step 6 of NewArrival: the nodes, sorted by name, get a random
// rank (Perm) and are renamed with it, so that ties between equal nodes go
// to a fresh random order per seed, as the original's renamed nodes do.
func rankNodes(r *rand.Rand, rows []NodeRow) []NodeRow {
	nodes := append([]NodeRow(nil), rows...)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	perm := r.Perm(len(nodes))
	order := make([]int, len(nodes))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(x, y int) bool { return perm[order[x]] < perm[order[y]] })
	out := make([]NodeRow, 0, len(nodes))
	for _, i := range order {
		n := nodes[i]
		n.Name = fmt.Sprintf("%04d-%s", perm[i], n.Name)
		out = append(out, n)
	}
	return out
}
