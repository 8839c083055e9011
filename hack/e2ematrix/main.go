// Command e2ematrix reads the go test -json output of the e2e suite at each
// Kubernetes minor (FILE named <minor>.json) and prints a matrix of every
// test by minor: pass, FAIL, or skip with the reason the test gave.
//
//	go run ./hack/e2ematrix out/e2e-versions/1.35.json out/e2e-versions/1.36.json ...
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

type event struct {
	Action string
	Test   string
	Output string
}

type result struct {
	state  string // pass, FAIL, skip, or "-" (did not run)
	reason string
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: e2ematrix <minor>.json ...")
		os.Exit(2)
	}
	var minors []string
	results := map[string]map[string]result{} // test -> minor -> result
	failed := false
	for _, path := range os.Args[1:] {
		minor := strings.TrimSuffix(filepath.Base(path), ".json")
		minors = append(minors, minor)
		res, err := read(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2ematrix:", err)
			os.Exit(1)
		}
		for test, r := range res {
			if results[test] == nil {
				results[test] = map[string]result{}
			}
			results[test][minor] = r
			failed = failed || r.state == "FAIL"
		}
	}
	tests := make([]string, 0, len(results))
	for t := range results {
		tests = append(tests, t)
	}
	slices.Sort(tests)
	fmt.Printf("| test | %s |\n|---|%s\n", strings.Join(minors, " | "), strings.Repeat("---|", len(minors)))
	counts := map[string]map[string]int{}
	for _, t := range tests {
		cells := make([]string, len(minors))
		for i, m := range minors {
			r, ok := results[t][m]
			if !ok {
				r = result{state: "-"}
			}
			cells[i] = r.state
			if r.state == "skip" && r.reason != "" {
				cells[i] = "skip: " + r.reason
			}
			if counts[m] == nil {
				counts[m] = map[string]int{}
			}
			counts[m][r.state]++
		}
		fmt.Printf("| %s | %s |\n", t, strings.Join(cells, " | "))
	}
	fmt.Println()
	for _, m := range minors {
		c := counts[m]
		fmt.Printf("%s: %d pass, %d fail, %d skip\n", m, c["pass"], c["FAIL"], c["skip"])
	}
	if failed {
		os.Exit(1)
	}
}

// read returns each top-level test's result in one go test -json stream.
func read(path string) (map[string]result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]result{}
	last := map[string]string{} // the test's last line of its own output
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		switch e.Action {
		case "output":
			line := strings.TrimSpace(e.Output)
			// A t.Skip or t.Log line reads "file_test.go:NN: message".
			if i := strings.Index(line, ".go:"); i > 0 && !strings.HasPrefix(line, "---") {
				if j := strings.Index(line[i+4:], ": "); j >= 0 {
					last[e.Test] = line[i+4+j+2:]
				}
			}
		case "pass":
			out[e.Test] = result{state: "pass"}
		case "fail":
			out[e.Test] = result{state: "FAIL"}
		case "skip":
			out[e.Test] = result{state: "skip", reason: strings.ReplaceAll(last[e.Test], "|", "/")}
		}
	}
	return out, sc.Err()
}
