#!/usr/bin/env bash
# The e2e suite on kind: create a cluster, build and load the image, deploy
# manifests/, give the workers fake GPUs (capacity and GFD labels), and run
# test/e2e against it with the Deployment as the scheduler under test.
#
# Needs a Docker engine. kind itself comes from the Go module proxy.
# Environment: KIND_CLUSTER (name), KIND_NODE_IMAGE (default
# kindest/node:v1.37.2), KEEP=1 keeps the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1; then
  echo "e2e-kind: no Docker engine; run 'make e2e' for the same suite on the local control plane" >&2
  exit 1
fi

CLUSTER=${KIND_CLUSTER:-gpu-scheduler-e2e}
NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.37.2}
IMAGE=gpu-scheduler:$(cat VERSION)
KIND="go run sigs.k8s.io/kind@v0.33.0"
make "$PWD/bin/kubectl" >/dev/null
KUBECTL="$PWD/bin/kubectl"
KUBECONFIG_FILE=$(mktemp)
export KUBECONFIG=$KUBECONFIG_FILE

cleanup() {
  if [ -z "${KEEP:-}" ]; then
    $KIND delete cluster --name "$CLUSTER" || true
  else
    echo "kept cluster $CLUSTER; kubeconfig: $KUBECONFIG_FILE"
  fi
}
trap cleanup EXIT

$KIND create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config hack/kind-config.yaml \
  --kubeconfig "$KUBECONFIG_FILE" --wait 180s

docker build -t "$IMAGE" --build-arg VERSION="$(cat VERSION)" .
$KIND load docker-image "$IMAGE" --name "$CLUSTER"

$KUBECTL apply -f manifests/
# The suite's shares are on nodes without a device agent (no HAMi device
# plugin here): it tests the accounting, as the local run does.
$KUBECTL -n kube-system get configmap gpu-scheduler-config -o json |
  sed 's/accountingOnlySharing: false/accountingOnlySharing: true/' | $KUBECTL apply -f -
$KUBECTL -n kube-system set image deployment/gpu-scheduler gpu-scheduler="$IMAGE"
$KUBECTL -n kube-system rollout status deployment/gpu-scheduler --timeout=180s

# Fake GPUs on the workers: 4 each, as a device plugin would advertise, and
# the GFD labels. Kubelet copies capacity into allocatable.
for n in $($KUBECTL get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
  $KUBECTL patch "$n" --subresource=status --type=json \
    -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"4"}]'
  $KUBECTL label --overwrite "$n" nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB \
    nvidia.com/gpu.memory=81920 nvidia.com/gpu.count=4 nvidia.com/gpu.present=true
done

E2E_KUBECONFIG="$KUBECONFIG_FILE" go test -count=1 -timeout 30m -v ./test/e2e/
