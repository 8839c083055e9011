# gpu-scheduler. Everything installs from the Go module proxy; build outputs
# are cached under bin/ (git-ignored).

SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
# Our version: VERSION (the image tag in manifests/deployment.yaml must match;
# a test checks it).
VERSION ?= $(shell cat $(CURDIR)/VERSION)
# The upstream version must stay v1.37.2: kube-scheduler's startup
# emulation-version check rejects anything else. Ours goes in pkg/version.
# client-go's version is only the User-Agent (gpu-scheduler/<ours> in the API
# server's audit log, not v0.0.0 and $Format); nothing validates it.
GIT_COMMIT ?= $(shell git -C $(CURDIR) rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X k8s.io/component-base/version.gitVersion=v1.37.2 \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 \
	-X github.com/gpu-scheduler/gpu-scheduler/pkg/version.Version=$(VERSION) \
	-X k8s.io/client-go/pkg/version.gitVersion=$(VERSION) \
	-X k8s.io/client-go/pkg/version.gitCommit=$(GIT_COMMIT)
PKGS := ./...
# Static binaries everywhere: the images are FROM scratch, and one build cache
# serves the host's binaries, the images' and the tests (only -race needs cgo).
export CGO_ENABLED := 0
UNIT_PKGS = $$($(GO) list ./... | grep -vE '/test/(e2e|integration|bench)')

K8S_PHONY := k8s-binaries k8s-e2e-binaries e2e-versions
.PHONY: $(K8S_PHONY) all build binaries run test unit integration e2e e2e-kind image lint dist bench bench-requeue bench-openb bench-dynamic bench-dra bench-throughput bench-churn fuzz manifests clean help

all: build

help:
	@echo "make run           local control plane + GPU fleet + gpu-scheduler + examples (or KUBECONFIG's cluster)"
	@echo "make test          unit and integration tests (what .ci/run calls, then make e2e)"
	@echo "make e2e           the built binary on the local control plane"
	@echo "make e2e-kind      the same suite on a kind cluster (needs Docker)"
	@echo "make build         bin/gpu-scheduler"
	@echo "make bench         per-node Filter/Score micro-benchmarks"
	@echo "make lint          gofmt and go vet"
	@echo "make dist          kubectl-gpu release archives and the krew manifest (out/dist)"

build: $(BIN)/gpu-scheduler

$(BIN)/gpu-scheduler: FORCE
	$(GO) build -ldflags "$(LDFLAGS)" -o $@ ./cmd/gpu-scheduler

FORCE:

# The control plane and the vanilla scheduler, built from the versions go.mod
# pins (tool directives). Rebuilt only when go.mod or go.sum change.
UPSTREAM_LDFLAGS := -X k8s.io/component-base/version.gitVersion=v1.37.2 \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37
$(BIN)/etcd: go.mod go.sum
	$(GO) build -o $@ go.etcd.io/etcd/server/v3
$(BIN)/kube-apiserver: go.mod go.sum
	$(GO) build -ldflags "$(UPSTREAM_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-apiserver
$(BIN)/kube-scheduler: go.mod go.sum
	$(GO) build -ldflags "$(UPSTREAM_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-scheduler
# The rest of a kind node and its control plane (make e2e-kind).
$(BIN)/kubelet: go.mod go.sum
	$(GO) build -ldflags "$(UPSTREAM_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubelet
$(BIN)/kubeadm: go.mod go.sum
	$(GO) build -ldflags "$(UPSTREAM_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubeadm
$(BIN)/kube-controller-manager: go.mod go.sum
	$(GO) build -ldflags "$(UPSTREAM_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-controller-manager
$(BIN)/kube-proxy: go.mod go.sum
	$(GO) build -ldflags "$(UPSTREAM_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-proxy
# kind and crictl, from their modules in a module of their own.
$(BIN)/kind: hack/tools/kind/go.mod hack/tools/kind/go.sum
	cd hack/tools/kind && $(GO) build -o $@ sigs.k8s.io/kind
$(BIN)/crictl: hack/tools/kind/go.mod hack/tools/kind/go.sum
	cd hack/tools/kind && $(GO) build -o $@ sigs.k8s.io/cri-tools/cmd/crictl
# The other supported minors (hack/k8s-minors): their control plane and etcd
# from hack/tools/k8s-<minor>, in bin/k8s-<minor>. K8S picks the minor of the
# local control plane for make run and make e2e (the newest by default).
K8S_MINORS := $(shell awk '!/^\#/ && NF {print $$1}' hack/k8s-minors)
K8S_NEWEST := $(lastword $(K8S_MINORS))
K8S ?= $(K8S_NEWEST)
ifeq ($(filter $(K8S),$(K8S_MINORS)),)
$(error K8S=$(K8S) is not a supported minor: $(K8S_MINORS) (hack/k8s-minors))
endif
ifeq ($(K8S),$(K8S_NEWEST))
K8S_BIN := $(BIN)
else
K8S_BIN := $(BIN)/k8s-$(K8S)
endif
k8s_version = $$($(GO) list -m -f '{{.Version}}' k8s.io/kubernetes)
k8s_ldflags = -X k8s.io/component-base/version.gitVersion=$(call k8s_version,$(1)) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(1)))
$(BIN)/k8s-%/etcd: hack/tools/k8s-%/go.mod hack/tools/k8s-%/go.sum
	cd hack/tools/k8s-$* && $(GO) build -o $@ go.etcd.io/etcd/server/v3
$(BIN)/k8s-%/kube-apiserver: hack/tools/k8s-%/go.mod hack/tools/k8s-%/go.sum
	cd hack/tools/k8s-$* && $(GO) build -ldflags "$(call k8s_ldflags,$*)" -o $@ k8s.io/kubernetes/cmd/kube-apiserver
$(BIN)/k8s-%/kube-scheduler: hack/tools/k8s-%/go.mod hack/tools/k8s-%/go.sum
	cd hack/tools/k8s-$* && $(GO) build -ldflags "$(call k8s_ldflags,$*)" -o $@ k8s.io/kubernetes/cmd/kube-scheduler
$(BIN)/k8s-%/kube-controller-manager: hack/tools/k8s-%/go.mod hack/tools/k8s-%/go.sum
	cd hack/tools/k8s-$* && $(GO) build -ldflags "$(call k8s_ldflags,$*)" -o $@ k8s.io/kubernetes/cmd/kube-controller-manager
# A kind node of the minor (make e2e-kind K8S=1.35).
$(BIN)/k8s-%/kubelet: hack/tools/k8s-%/go.mod hack/tools/k8s-%/go.sum
	cd hack/tools/k8s-$* && $(GO) build -ldflags "$(call k8s_ldflags,$*)" -o $@ k8s.io/kubernetes/cmd/kubelet
$(BIN)/k8s-%/kubeadm: hack/tools/k8s-%/go.mod hack/tools/k8s-%/go.sum
	cd hack/tools/k8s-$* && $(GO) build -ldflags "$(call k8s_ldflags,$*)" -o $@ k8s.io/kubernetes/cmd/kubeadm
$(BIN)/k8s-%/kubectl: hack/tools/k8s-%/go.mod hack/tools/k8s-%/go.sum
	cd hack/tools/k8s-$* && $(GO) build -ldflags "$(call k8s_ldflags,$*)" -o $@ k8s.io/kubernetes/cmd/kubectl
$(BIN)/k8s-%/kube-proxy: hack/tools/k8s-%/go.mod hack/tools/k8s-%/go.sum
	cd hack/tools/k8s-$* && $(GO) build -ldflags "$(call k8s_ldflags,$*)" -o $@ k8s.io/kubernetes/cmd/kube-proxy
.PRECIOUS: $(BIN)/k8s-%/etcd $(BIN)/k8s-%/kube-apiserver $(BIN)/k8s-%/kube-scheduler $(BIN)/k8s-%/kube-controller-manager \
	$(BIN)/k8s-%/kubelet $(BIN)/k8s-%/kubeadm $(BIN)/k8s-%/kubectl $(BIN)/k8s-%/kube-proxy
# The control plane of K8S: etcd and kube-apiserver; the vanilla scheduler
# and the Job controller for the e2e suite.
k8s-binaries: $(K8S_BIN)/etcd $(K8S_BIN)/kube-apiserver
k8s-e2e-binaries: k8s-binaries $(K8S_BIN)/kube-scheduler $(K8S_BIN)/kube-controller-manager

# Kueue's controller and CRDs, from its module in a module of its own (the
# e2e suite's queue tests run it with the Job controller).
$(BIN)/kueue: hack/tools/kueue/go.mod hack/tools/kueue/go.sum
	cd hack/tools/kueue && $(GO) build -o $@ sigs.k8s.io/kueue/cmd/kueue
	rm -rf $(BIN)/kueue-crds && mkdir -p $(BIN)/kueue-crds
	cp "$$(cd hack/tools/kueue && $(GO) list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"/config/components/crd/bases/*.yaml $(BIN)/kueue-crds/
	chmod u+w $(BIN)/kueue-crds/*.yaml
# The test images' programs (test/images), static.
$(BIN)/images/%: FORCE
	$(GO) build -ldflags "-s -w" -o $@ ./test/images/$*
$(BIN)/gpu-run: FORCE
	$(GO) build -o $@ ./cmd/gpu-run

# The kubectl plugin (kubectl gpu nodes|pending|frag): put bin/ on PATH.
$(BIN)/kubectl-gpu: FORCE
	$(GO) build -ldflags "$(LDFLAGS)" -o $@ ./cmd/kubectl-gpu

# The same binary with the test-only fault switches (pkg/fault) compiled in.
$(BIN)/gpu-scheduler-faultinject: FORCE
	$(GO) build -tags faultinject -ldflags "$(LDFLAGS)" -o $@ ./cmd/gpu-scheduler

binaries: $(BIN)/etcd $(BIN)/kube-apiserver $(BIN)/kube-scheduler $(BIN)/gpu-scheduler $(BIN)/gpu-scheduler-faultinject $(BIN)/kubectl-gpu

# The main job: a local control plane with a GPU fleet (or $$KUBECONFIG's
# cluster), gpu-scheduler beside it, the examples, and a placement table.
run: binaries k8s-binaries $(BIN)/gpu-run
	$(BIN)/gpu-run --bin $(BIN) --k8s-bin $(K8S_BIN) $(RUN_ARGS)

# The files made from the canonical ones: configmap.yaml, the chart's
# files/, and deployment.yaml rendered from the chart.
manifests: $(BIN)/helm
	$(GO) run ./hack/genmanifests
	$(BIN)/helm template gpu-scheduler manifests/charts/gpu-scheduler --namespace kube-system --kube-version 1.37.2 \
	  --show-only templates/deployment.yaml > manifests/deployment.yaml.tmp
	{ echo "# Generated from charts/gpu-scheduler (default values) by make manifests. Do not edit."; \
	  sed -e '/^---$$/d' -e '/^# Source:/d' -e '/app.kubernetes.io\/managed-by: Helm/d' manifests/deployment.yaml.tmp; } > manifests/deployment.yaml
	rm manifests/deployment.yaml.tmp

# Release archives of kubectl-gpu (kubectl-gpu_<os>_<arch>.tar.gz, the binary
# and LICENSE: static, no cgo; built and packed reproducibly, so a rebuild of
# the same commit gives the same checksums) and the krew manifest with their
# checksums, in $(DIST). Upload
# the archives to RELEASE_URL; the manifest points there.
DIST ?= $(CURDIR)/out/dist
DIST_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64
RELEASE_URL ?= https://github.com/gpu-scheduler/gpu-scheduler/releases/download/$(VERSION)
dist:
	rm -rf $(DIST) && mkdir -p $(DIST)
	set -e; for p in $(DIST_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; exe=kubectl-gpu; [ $$os = windows ] && exe=kubectl-gpu.exe; \
	  d=$(DIST)/kubectl-gpu_$${os}_$${arch}; mkdir -p $$d; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $$d/$$exe ./cmd/kubectl-gpu; \
	  cp LICENSE $$d/; \
	  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - -C $$d $$exe LICENSE | gzip -n > $$d.tar.gz; \
	  rm -rf $$d; \
	done
	$(GO) run ./hack/krewmanifest -version $(VERSION) -url $(RELEASE_URL) $(DIST)/*.tar.gz > $(DIST)/gpu.yaml
	@echo "$(DIST)/gpu.yaml: the krew manifest"

# krew, from its Go module (its own module: it pins old Kubernetes modules),
# to test the manifest by installing from it.
$(BIN)/krew: hack/tools/krew/go.mod hack/tools/krew/go.sum
	cd hack/tools/krew && $(GO) build -o $@ sigs.k8s.io/krew/cmd/krew

# Helm, from its Go module (hack/tools), for the chart's tests and make manifests.
$(BIN)/helm: hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && $(GO) build -o $@ helm.sh/helm/v3/cmd/helm

lint: $(BIN)/promrules
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(BIN)/promrules -rules manifests/monitoring/alerts.yaml -dashboard manifests/monitoring/dashboard.json

# Prometheus' rule checker (promtool's code), from its Go module in a module
# of its own (hack/tools): its dependencies stay out of the main module.
$(BIN)/promrules: hack/tools/go.mod hack/tools/go.sum hack/tools/promrules/main.go
	cd hack/tools && $(GO) build -o $@ ./promrules

# Unit tests (the fuzz seed corpora run as ordinary tests), with the race
# detector on the packages that share state between goroutines.
unit:
	$(GO) test -count=1 $(UNIT_PKGS)
	CGO_ENABLED=1 $(GO) test -count=1 -race ./pkg/gpu/... ./pkg/plugins/... ./pkg/overcommit/... ./pkg/requeue/...
	# Every benchmark of these packages once, so that none rots (timing is
	# make bench's; here they only have to run).
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x $(UNIT_PKGS)

# The scheduler in-process against a real kube-apiserver and etcd.
integration: $(BIN)/etcd $(BIN)/kube-apiserver $(BIN)/kubectl-gpu $(BIN)/helm $(BIN)/krew $(BIN)/promrules
	$(GO) test -count=1 -timeout 20m ./test/integration/

test: lint unit integration

# The built binary against the local control plane, beside the vanilla
# kube-scheduler. E2E_KUBECONFIG=<file> runs it against a deployed cluster.
e2e: binaries k8s-e2e-binaries $(BIN)/kueue
	GPU_SCHEDULER_K8S_BIN=$(K8S_BIN) $(GO) test -count=1 -timeout 30m -v ./test/e2e/ 2>&1 | grep -vE '^[IWE][0-9]{4} ' ; exit $${PIPESTATUS[0]}

# The suite on the local control plane of each supported minor, and a matrix
# of every test by minor (hack/e2e-versions.sh; MINORS, RUN narrow it).
e2e-versions:
	hack/e2e-versions.sh

# The suite on kind: real kubelets and device plugins, our image, the chart
# (hack/e2e-kind.sh; needs dockerd and debootstrap).
e2e-kind:
	K8S=$(K8S) hack/e2e-kind.sh

# The image, tagged with VERSION as manifests/deployment.yaml expects: the
# static binary built here, FROM scratch, non-root (hack/image/Dockerfile).
# It needs a Docker engine and no registry. The Dockerfile at the top builds
# the same from a golang image, for machines that can pull.
$(BIN)/image/gpu-scheduler: FORCE
	$(GO) build -ldflags "-s -w $(LDFLAGS)" -o $@ ./cmd/gpu-scheduler
image: $(BIN)/image/gpu-scheduler
	cp hack/image/Dockerfile $(BIN)/image/Dockerfile
	DOCKER_BUILDKIT=0 docker build -q -t gpu-scheduler:$(VERSION) --build-arg VERSION=$(VERSION) $(BIN)/image

$(BIN)/kubectl: go.mod go.sum
	$(GO) build -ldflags "$(UPSTREAM_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubectl

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./pkg/plugins/

# Requeue latency (deletion -> next bind) for the full design, without
# hints, without the reconciler, and without both, quiet and under churn (a
# backlog that fits nowhere, CPU pods streamed through the scheduler); then
# the reconciler's cost with 5000 pending pods on 1000 nodes. JSON=FILE
# writes the figures; BENCH_ARGS="-requeue-churn=false" skips the churn runs.
bench-requeue: binaries
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench 'BenchmarkRequeueLatency|BenchmarkReconcilerCost' -benchtime 1x ./test/bench/ \
		-args $(if $(JSON),-json $(abspath $(JSON))) $(BENCH_ARGS) 2>&1 | grep -vE '^[IWE][0-9]{4} ' ; exit $${PIPESTATUS[0]}

# The openb replay grid: 17 workloads x 10 seeds x the six policies, next
# to the published FGD results. Runs already done in OUT/runs are reused.
OPENB_TRACE ?= data/openb
OPENB_OUT ?= out/openb
OPENB_POLICIES ?= learned,fgd,bestfit,packing,spread,vanilla
PARALLEL ?= 2
$(BIN)/gpu-sim: FORCE
	$(GO) build -o $@ ./cmd/gpu-sim
bench-openb: $(BIN)/gpu-sim
	$(BIN)/gpu-sim --trace-dir $(OPENB_TRACE) --workload grid --policy $(OPENB_POLICIES) --seeds 42-51 --tune 1.3 \
		--parallel $(PARALLEL) --out $(OPENB_OUT) $(if $(JSON),--json > $(JSON),)

# The openb trace with departures (gpu-sim --mode dynamic): arrivals at
# creation_time compressed into DYN_SPAN, each pod running its trace
# duration, waiting pods in the scheduler's own queue; wait times and
# time-averaged allocation per policy (docs/benchmarks.md).
DYN_WORKLOADS ?= default
DYN_POLICIES ?= learned,fgd-pure,bestfit,packing,spread,vanilla
DYN_SEEDS ?= 42-44
DYN_SPAN ?= 30m
DYN_OUT ?= out/dynamic
DYN_FLUSH ?= 0
bench-dynamic: $(BIN)/gpu-sim
	$(BIN)/gpu-sim --mode dynamic --trace-dir $(OPENB_TRACE) --workload $(DYN_WORKLOADS) --policy $(DYN_POLICIES) \
		--seeds $(DYN_SEEDS) --tune 1.3 --arrival-span $(DYN_SPAN) --flush $(DYN_FLUSH) --out $(DYN_OUT)

# DRA's device choice (issue 33): a fleet whose devices DRA's allocator hands
# out, nodes chosen as by learned, each pod's devices the allocator's first
# fit in the slices' order (upstream's plugin) or in ours (GPUDynamicResources:
# best fit); static on every workload, and with departures on default
# (docs/benchmarks.md § DRA).
DRA_SEEDS ?= 42-46
DRA_OUT ?= out/dra
bench-dra: $(BIN)/gpu-sim
	$(BIN)/gpu-sim --trace-dir $(OPENB_TRACE) --workload grid --policy learned-dra-firstfit,learned-dra,learned --seeds $(DRA_SEEDS) \
		--tie-order reference --tune 1.3 --parallel $(PARALLEL) --out $(DRA_OUT)
	$(BIN)/gpu-sim --mode dynamic --trace-dir $(OPENB_TRACE) --workload default --policy learned-dra-firstfit,learned-dra \
		--seeds 42-44 --tune 1.3 --arrival-span 30m --out $(DRA_OUT)-dynamic

# Scheduling throughput of gpu-scheduler beside the vanilla kube-scheduler,
# same control plane, same pods: (a) vanilla / (b) ours on CPU-only pods,
# (c) ours on the openb-like GPU mix, (d) vanilla on it with whole GPUs;
# BENCH_ARGS="-variants a,b,a2,c,d" adds a2, (a) again after (b), a control.
NODES ?= 5000
PODS ?= 10000
bench-throughput: binaries
	$(GO) test -count=1 -timeout 90m -run '^$$' -bench 'BenchmarkThroughput' -benchtime 1x ./test/bench/ \
		-args -nodes $(NODES) -pods $(PODS) $(if $(ROUNDS),-rounds $(ROUNDS)) $(if $(PPROF),-pprof $(abspath $(PPROF))) $(if $(JSON),-json $(abspath $(JSON))) $(if $(MAX_CPU_RATIO),-max-cpu-ratio $(MAX_CPU_RATIO)) $(BENCH_ARGS) \
		2>&1 | grep -vE '^[IWE][0-9]{4} ' ; exit $${PIPESTATUS[0]}

# The stream of GPU pods that fit, bound quiet and under churn (a backlog of
# GPU pods that fit nowhere, GFD relabelling every node once a minute, CPU
# pods created and deleted), by gpu-scheduler and by the vanilla scheduler.
BACKLOG ?= 20000
STREAM ?= 5000
bench-churn: binaries
	$(GO) test -count=1 -timeout 150m -run '^$$' -bench 'BenchmarkChurn' -benchtime 1x ./test/bench/ \
		-args -nodes $(NODES) -backlog $(BACKLOG) -stream $(STREAM) $(if $(ROUNDS),-rounds $(ROUNDS)) $(if $(PPROF),-pprof $(abspath $(PPROF))) $(if $(JSON),-json $(abspath $(JSON))) $(BENCH_ARGS) \
		2>&1 | grep -vE '^[IWE][0-9]{4} ' ; exit $${PIPESTATUS[0]}

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseRequest -fuzztime 60s ./pkg/gpu/
	$(GO) test -run '^$$' -fuzz FuzzParseAssignment -fuzztime 60s ./pkg/gpu/
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 60s ./pkg/agent/hami/

clean:
	rm -rf $(BIN)
