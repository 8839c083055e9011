// Package simulator replays GPU cluster traces in the openb format on the
// real scheduling framework (pkg/offline): the same profile as the binary,
// the production plugins, one pod at a time, as the published FGD method
// does (docs in ../shared/docs/openb-benchmark.md).
package simulator

import (
	"compress/gzip"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// NodeRow is a node of the trace.
type NodeRow struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// PodRow is a pod of the trace, reduced to what scheduling reads.
type PodRow struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	// NumGPU and GPUMilli as the converter reads them: GPUMilli is the
	// per-device share (1000 for whole GPUs), 0 with NumGPU 0.
	NumGPU   int
	GPUMilli int
	// Models is the allowed set (empty: any).
	Models []string
	// Created and Deleted are the trace's creation_time and deletion_time
	// (seconds; 0 when the trace has none): the dynamic replay's arrival
	// and run time.
	Created, Deleted int64
}

// GPURequest is the pod's total GPU request in milli (G_p = m·k).
func (p *PodRow) GPURequest() int64 { return int64(p.GPUMilli) * int64(p.NumGPU) }

// Trace is one workload with its cluster.
type Trace struct {
	Workload string
	Nodes    []NodeRow
	Pods     []PodRow
}

// Capacity is the cluster's GPU capacity in milli.
func (t *Trace) Capacity() int64 {
	var c int64
	for _, n := range t.Nodes {
		c += int64(n.GPUs) * 1000
	}
	return c
}

// DefaultTraceDir is where the repository keeps the openb trace
// (compressed), relative to its root.
const DefaultTraceDir = "data/openb"

// Open opens a trace file, or its gzip-compressed copy (path + ".gz") when
// the file itself is not there.
func Open(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err == nil {
		return f, nil
	}
	gz, gerr := os.Open(path + ".gz")
	if gerr != nil {
		return nil, err
	}
	zr, zerr := gzip.NewReader(gz)
	if zerr != nil {
		gz.Close()
		return nil, fmt.Errorf("%s.gz: %w", path, zerr)
	}
	return &gzipFile{Reader: zr, f: gz}, nil
}

type gzipFile struct {
	*gzip.Reader
	f *os.File
}

func (g *gzipFile) Close() error {
	g.Reader.Close()
	return g.f.Close()
}

// NodeFile is the node list the published experiments use (GPU nodes only).
const NodeFile = "openb_node_list_gpu_node.csv"

// PodFile is the pod list of a workload.
func PodFile(workload string) string { return "openb_pod_list_" + workload + ".csv" }

// Workloads lists the workloads of a trace directory.
func Workloads(dir string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, pattern := range []string{"openb_pod_list_*.csv", "openb_pod_list_*.csv.gz"} {
		matches, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return nil, err
		}
		for _, m := range matches {
			w := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "openb_pod_list_"), ".gz"), ".csv")
			if !seen[w] {
				seen[w] = true
				out = append(out, w)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// PaperGrid is the 17 workloads of the published experiment grid.
var PaperGrid = []string{
	"default", "cpu050", "cpu100", "cpu200", "cpu250",
	"gpushare40", "gpushare60", "gpushare80", "gpushare100",
	"gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
	"multigpu20", "multigpu30", "multigpu40", "multigpu50",
}

// Load reads a workload and the GPU node list from a trace directory.
func Load(dir, workload string) (*Trace, error) {
	nodes, err := LoadNodes(filepath.Join(dir, NodeFile))
	if err != nil {
		return nil, err
	}
	pods, err := LoadPods(filepath.Join(dir, PodFile(workload)))
	if err != nil {
		return nil, err
	}
	return &Trace{Workload: workload, Nodes: nodes, Pods: pods}, nil
}

type table struct {
	cols map[string]int
	rows [][]string
	path string
}

func readCSV(path string) (*table, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t := &table{cols: map[string]int{}, path: path}
	for i, h := range header {
		t.cols[strings.TrimSpace(h)] = i
	}
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		t.rows = append(t.rows, rec)
	}
	return t, nil
}

func (t *table) str(row []string, col string) string {
	i, ok := t.cols[col]
	if !ok || i >= len(row) {
		return ""
	}
	return strings.TrimSpace(row[i])
}

func (t *table) int(row []string, col string) (int64, error) {
	s := t.str(row, col)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: column %s: %q: %w", t.path, col, s, err)
	}
	return v, nil
}

func (t *table) require(cols ...string) error {
	for _, c := range cols {
		if _, ok := t.cols[c]; !ok {
			return fmt.Errorf("%s: no column %q", t.path, c)
		}
	}
	return nil
}

// LoadNodes reads sn, cpu_milli, memory_mib, gpu, model.
func LoadNodes(path string) ([]NodeRow, error) {
	t, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	if err := t.require("sn", "cpu_milli", "memory_mib", "gpu"); err != nil {
		return nil, err
	}
	var out []NodeRow
	for _, row := range t.rows {
		n := NodeRow{Name: t.str(row, "sn"), Model: t.str(row, "model")}
		var g int64
		if n.CPUMilli, err = t.int(row, "cpu_milli"); err != nil {
			return nil, err
		}
		if n.MemoryMiB, err = t.int(row, "memory_mib"); err != nil {
			return nil, err
		}
		if g, err = t.int(row, "gpu"); err != nil {
			return nil, err
		}
		n.GPUs = int(g)
		out = append(out, n)
	}
	return out, nil
}

// LoadPods reads name, cpu_milli, memory_mib, num_gpu, gpu_milli and the
// optional gpu_spec, with the converter's rules: the per-device share is
// gpu_milli, capped at 1000; a pod without GPUs has none; empty parts of the
// '|'-separated spec are dropped.
func LoadPods(path string) ([]PodRow, error) {
	t, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	if err := t.require("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"); err != nil {
		return nil, err
	}
	var out []PodRow
	for _, row := range t.rows {
		p := PodRow{Name: t.str(row, "name")}
		var k, m int64
		if p.CPUMilli, err = t.int(row, "cpu_milli"); err != nil {
			return nil, err
		}
		if p.MemoryMiB, err = t.int(row, "memory_mib"); err != nil {
			return nil, err
		}
		if k, err = t.int(row, "num_gpu"); err != nil {
			return nil, err
		}
		if m, err = t.int(row, "gpu_milli"); err != nil {
			return nil, err
		}
		if p.Created, err = t.int(row, "creation_time"); err != nil {
			return nil, err
		}
		if p.Deleted, err = t.int(row, "deletion_time"); err != nil {
			return nil, err
		}
		if k > 0 {
			p.NumGPU = int(k)
			switch {
			case m > 1000:
				p.GPUMilli = 1000
			case m > 0:
				p.GPUMilli = int(m)
			}
			for _, s := range strings.Split(t.str(row, "gpu_spec"), "|") {
				if s = strings.TrimSpace(s); s != "" {
					p.Models = append(p.Models, s)
				}
			}
		}
		if p.GPUMilli == 0 {
			p.NumGPU = 0 // a GPU count with no share asks for no GPU
		}
		out = append(out, p)
	}
	return out, nil
}
