#!/usr/bin/env bash
# make e2e-versions: the e2e suite on the local control plane of each
# supported Kubernetes minor (hack/k8s-minors; MINORS="1.35 1.36" for some),
# each with the kube-apiserver, etcd, vanilla kube-scheduler and
# kube-controller-manager of that minor built from their modules, then a
# matrix of every test by minor (out/e2e-versions/matrix.md). RUN narrows the
# tests (go test -run). Fails if any test failed at any minor.
set -euo pipefail
cd "$(dirname "$0")/.."
all=$(awk '!/^#/ && NF {print $1}' hack/k8s-minors)
newest=$(echo "$all" | tail -1)
minors=${MINORS:-$all}
out=out/e2e-versions
rm -rf "$out" && mkdir -p "$out"
make --no-print-directory binaries "$PWD/bin/kueue" >/dev/null
rc=0
for m in $minors; do
  bin=$PWD/bin
  [ "$m" = "$newest" ] || bin=$PWD/bin/k8s-$m
  start=$(date +%s)
  make --no-print-directory k8s-e2e-binaries K8S="$m" >/dev/null
  echo "e2e-versions: Kubernetes $m ($("$bin"/kube-apiserver --version))"
  GPU_SCHEDULER_K8S_BIN=$bin go test -count=1 -timeout 30m -json ${RUN:+-run "$RUN"} ./test/e2e/ > "$out/$m.json" || rc=1
  echo "e2e-versions: Kubernetes $m done in $(( $(date +%s) - start ))s"
done
go run ./hack/e2ematrix "$out"/*.json | tee "$out/matrix.md" || rc=1
exit $rc
