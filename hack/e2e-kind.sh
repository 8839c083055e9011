#!/usr/bin/env bash
# make e2e-kind: the e2e suite on a kind cluster with real kubelets, the way
# users run gpu-scheduler. Everything is built here, nothing is pulled:
#  1. images (hack/kind/images.sh): the kind node image (cached by what went
#     into it), gpu-scheduler:<VERSION> (make image) and the test images;
#  2. a cluster of a control plane and two GPU workers (hack/kind/cluster.yaml),
#     pod networking by podnet, GPUs from real device plugins (an NVIDIA-style
#     one and HAMi's protocol) as DaemonSets;
#  3. gpu-scheduler installed as the README says: the image loaded into the
#     nodes, then helm install from manifests/charts/gpu-scheduler;
#  4. go test ./test/e2e/ against it (E2E_KUBECONFIG; E2E_KIND=1 runs the
#     tests on the real workers).
# Needs a Docker engine (Debian's docker.io) and debootstrap.
# Environment: KIND_CLUSTER (name), KEEP=1 keeps the cluster, E2E_RUN (a
# go test -run pattern: one pass, chart defaults), E2E_ARGS (more go test
# flags).
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH=$PATH:/usr/sbin:/sbin
CLUSTER=${KIND_CLUSTER:-gpu-scheduler-e2e}
VERSION=$(cat VERSION)
OUT=$ROOT/out/kind
mkdir -p "$OUT"
start=$(date +%s)
phase() { echo "e2e-kind: [$(( $(date +%s) - start ))s] $*" >&2; }

if ! docker info >/dev/null 2>&1; then
  echo "e2e-kind: no Docker engine (start dockerd); 'make e2e' runs the suite on the local control plane" >&2
  exit 1
fi
# kind runs its nodes --privileged, which needs CAP_SYS_RESOURCE in the
# capability bounding set; where it is missing, hack/kind/docker stands in.
capbnd=$(awk '/^CapBnd/ {print $2}' /proc/self/status)
if (( (0x$capbnd >> 24 & 1) == 0 )); then
  phase "no CAP_SYS_RESOURCE here: kind's nodes get every other capability instead of --privileged"
  export PATH=$ROOT/hack/kind:$PATH
fi

make -s "$ROOT/bin/kind" "$ROOT/bin/kubectl" "$ROOT/bin/helm"
KIND=$ROOT/bin/kind
KUBECTL=$ROOT/bin/kubectl
HELM=$ROOT/bin/helm
export KUBECONFIG=$OUT/kubeconfig

phase "building images (Kubernetes ${K8S:-the newest minor})"
hack/kind/images.sh all
NODE_IMAGE=$(cat bin/kind-node-image)

cleanup() {
  code=$?
  if [ $code -ne 0 ]; then
    phase "failed ($code); cluster logs in $OUT/logs"
    rm -rf "$OUT/logs"
    $KIND export logs "$OUT/logs" --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  if [ -z "${KEEP:-}" ]; then
    $KIND delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  else
    echo "e2e-kind: kept cluster $CLUSTER; KUBECONFIG=$KUBECONFIG" >&2
  fi
  exit $code
}
trap cleanup EXIT

phase "creating cluster $CLUSTER from $NODE_IMAGE"
$KIND delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
$KIND create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config hack/kind/cluster.yaml --kubeconfig "$KUBECONFIG"

phase "loading images"
$KIND load docker-image --name "$CLUSTER" gpu-scheduler:"$VERSION" \
  gpu-scheduler-e2e/podnet:e2e gpu-scheduler-e2e/nvidia-plugin:e2e gpu-scheduler-e2e/hami-plugin:e2e \
  gpu-scheduler-e2e/gpu-workload:e2e gpu-scheduler-e2e/pause:e2e >"$OUT/load.log" 2>&1 || { cat "$OUT/load.log" >&2; exit 1; }

phase "pod networking"
$KUBECTL apply -f hack/kind/manifests/podnet.yaml >/dev/null
$KUBECTL wait --for=condition=Ready nodes --all --timeout=300s

phase "device plugins"
$KUBECTL apply -f hack/kind/manifests/device-plugins.yaml >/dev/null
$KUBECTL -n kube-system rollout status daemonset/nvidia-device-plugin --timeout=180s
$KUBECTL -n kube-system rollout status daemonset/hami-device-plugin --timeout=180s
ready=
for _ in $(seq 1 120); do
  gpus=$($KUBECTL get nodes -l gpu-scheduler.io/e2e-agent -o jsonpath='{range .items[*]}{.status.allocatable.nvidia\.com/gpu}{" "}{end}')
  registered=$($KUBECTL get nodes -l gpu-scheduler.io/e2e-agent=hami -o jsonpath='{.items[*].metadata.annotations.hami\.io/node-nvidia-register}')
  if [ "$(echo $gpus | wc -w)" = 2 ] && [ -n "$registered" ]; then ready=1; break; fi
  sleep 1
done
[ -n "$ready" ] || { echo "e2e-kind: the device plugins did not register (nvidia.com/gpu allocatable: '$gpus')" >&2; exit 1; }
phase "GPUs allocatable per worker: $gpus"

phase "installing gpu-scheduler with helm"
$HELM install gpu-scheduler manifests/charts/gpu-scheduler --namespace kube-system --wait --timeout 5m

# Two passes of go test ./test/e2e/ (one build): the tests on the real
# workers with the chart's defaults, then, after a helm upgrade to
# accountingOnlySharing=true, the suite's tests on fake nodes (their shares
# sit on nodes without an agent, as on the local control plane), against
# the same deployed scheduler.
suite() {
  E2E_KUBECONFIG=$KUBECONFIG E2E_KIND=1 E2E_FIGURES=$OUT/figures.json go test -count=1 -timeout 60m -v "$@" ${E2E_ARGS:-} ./test/e2e/ 2>&1 |
    grep --line-buffered -vE '^[IWE][0-9]{4} ' | tee -a "$OUT/e2e.log"
  return "${PIPESTATUS[0]}"
}
: > "$OUT/e2e.log"
status=0
phase "running the suite on the real workers"
suite -run "${E2E_RUN:-^TestKind}" || status=$?
if [ -z "${E2E_RUN:-}" ]; then
  # The restarted scheduler learns its target workload from the pods it
  # finds: let the first pass's go first, as on a fresh control plane.
  for _ in $(seq 1 180); do
    [ -z "$($KUBECTL get namespaces -o name | grep '^namespace/e2e-')" ] && break
    sleep 1
  done
  phase "helm upgrade: accountingOnlySharing=true"
  $HELM upgrade gpu-scheduler manifests/charts/gpu-scheduler --namespace kube-system --reuse-values \
    --set accountingOnlySharing=true --wait --timeout 5m
  phase "running the suite on fake nodes against the deployed scheduler"
  suite -skip '^TestKind' || status=$?
fi
phase "suite finished ($status)"
exit "$status"
