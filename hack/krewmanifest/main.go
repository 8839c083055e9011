// Command krewmanifest writes the krew plugin manifest of kubectl-gpu for
// the release archives given (kubectl-gpu_<os>_<arch>.tar.gz, made by
// make dist): one platform per archive, with its checksum and download URL.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

type selector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

type file struct {
	From string `json:"from"`
	To   string `json:"to"`
}

type platform struct {
	Selector selector `json:"selector"`
	URI      string   `json:"uri"`
	SHA256   string   `json:"sha256"`
	Bin      string   `json:"bin"`
	Files    []file   `json:"files"`
}

type manifest struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   map[string]string `json:"metadata"`
	Spec       struct {
		Version          string     `json:"version"`
		Homepage         string     `json:"homepage"`
		ShortDescription string     `json:"shortDescription"`
		Description      string     `json:"description"`
		Caveats          string     `json:"caveats"`
		Platforms        []platform `json:"platforms"`
	} `json:"spec"`
}

func main() {
	version := flag.String("version", "", "the release version (vX.Y.Z)")
	url := flag.String("url", "", "where the release's archives are downloaded from")
	homepage := flag.String("homepage", "https://github.com/gpu-scheduler/gpu-scheduler", "the project's home page")
	flag.Parse()
	if err := run(os.Stdout, *version, *url, *homepage, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "krewmanifest:", err)
		os.Exit(1)
	}
}

func run(out io.Writer, version, url, homepage string, archives []string) error {
	if !strings.HasPrefix(version, "v") || url == "" || len(archives) == 0 {
		return fmt.Errorf("usage: krewmanifest -version vX.Y.Z -url URL kubectl-gpu_<os>_<arch>.tar.gz...")
	}
	m := manifest{APIVersion: "krew.googlecontainertools.github.com/v1alpha2", Kind: "Plugin",
		Metadata: map[string]string{"name": "gpu"}}
	m.Spec.Version = version
	m.Spec.Homepage = homepage
	m.Spec.ShortDescription = "GPU allocation, fragmentation and what-if placement"
	m.Spec.Description = `Shows the GPUs of a cluster as gpu-scheduler counts them: per node and
device, what is allocated and to which pods (nodes); the GPU pods that wait
and why (pending); the idle GPU that the typical pods could not use, and how
many more of each would fit (frag); and where given pods would go through
the scheduler's own plugins, without writing anything (whatif).
`
	m.Spec.Caveats = `It lists nodes and pods cluster-wide, and reads the ConfigMap
kube-system/gpu-scheduler-config when it may (else the shipped configuration).
`
	sort.Strings(archives)
	for _, a := range archives {
		name := strings.TrimSuffix(filepath.Base(a), ".tar.gz")
		parts := strings.Split(name, "_")
		if len(parts) != 3 || parts[0] != "kubectl-gpu" || !strings.HasSuffix(a, ".tar.gz") {
			return fmt.Errorf("%s: not kubectl-gpu_<os>_<arch>.tar.gz", a)
		}
		sum, err := sha256File(a)
		if err != nil {
			return err
		}
		bin := "kubectl-gpu"
		if parts[1] == "windows" {
			bin += ".exe"
		}
		m.Spec.Platforms = append(m.Spec.Platforms, platform{
			Selector: selector{MatchLabels: map[string]string{"os": parts[1], "arch": parts[2]}},
			URI:      strings.TrimSuffix(url, "/") + "/" + filepath.Base(a),
			SHA256:   sum,
			Bin:      bin,
			Files:    []file{{From: bin, To: "."}, {From: "LICENSE", To: "."}},
		})
	}
	data, err := yaml.Marshal(m)
	if err != nil {
		return err
	}
	_, err = out.Write(data)
	return err
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
