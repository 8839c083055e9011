#!/usr/bin/env bash
# Builds every image make e2e-kind needs, on a machine that can pull none:
#   node      the kind node image (Debian by debootstrap, kind's base files,
#             kubelet/kubeadm/kubectl, and the control plane's images loaded
#             into its containerd), cached by a key over all that went in;
#   scheduler gpu-scheduler:<VERSION> (make image);
#   test      pause, gpu-workload, nvidia-plugin, hami-plugin, podnet.
# Usage: hack/kind/images.sh node|scheduler|test|all. Prints nothing but
# progress; the node image's name is in bin/kind-node-image afterwards.
# The binaries come from make (static, CGO_ENABLED=0), so that FROM scratch
# images run them.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/sbin:/sbin
# debootstrap and the root file system it makes need root.
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
# Everything temporary lives in WORK, and goes with the build container
# however the script ends.
WORK=$(mktemp -d)
CONTAINERS=()
cleanup() {
  for c in "${CONTAINERS[@]}"; do docker rm -f -v "$c" >/dev/null 2>&1 || true; done
  $SUDO rm -rf "$WORK" 2>/dev/null || true
}
trap cleanup EXIT
tmpdir() { mktemp -d -p "$WORK"; }
ROOT=$PWD
BIN=$ROOT/bin
# K8S picks the node image's Kubernetes minor (hack/k8s-minors; the newest,
# the main module's, by default): its kubelet, kubeadm, kubectl and control
# plane come from bin/k8s-<minor> (hack/tools/k8s-<minor>).
NEWEST=$(awk '!/^#/ && NF {m=$1} END {print m}' hack/k8s-minors)
K8S=${K8S:-$NEWEST}
KUBE_VERSION=$(awk -v m="$K8S" '!/^#/ && $1 == m {print $2}' hack/k8s-minors)
[ -n "$KUBE_VERSION" ] || { echo "images: K8S=$K8S is not a minor of hack/k8s-minors" >&2; exit 1; }
KBIN=$BIN
[ "$K8S" = "$NEWEST" ] || KBIN=$BIN/k8s-$K8S
VERSION=$(cat VERSION)
KIND_MOD=sigs.k8s.io/kind@v0.33.0
export DOCKER_BUILDKIT=0 # the classic builder: FROM scratch or a local image, never a pull

log() { echo "images: $*" >&2; }

# static_image TAG BINARY [USER]: the binary alone, FROM scratch.
static_image() {
  local tag=$1 bin=$2 user=${3:-} ctx
  ctx=$(tmpdir)
  cp "$bin" "$ctx/"
  {
    echo "FROM scratch"
    echo "COPY $(basename "$bin") /usr/local/bin/$(basename "$bin")"
    echo "ENV PATH=/usr/local/bin"
    [ -n "$user" ] && echo "USER $user"
    echo "ENTRYPOINT [\"/usr/local/bin/$(basename "$bin")\"]"
  } > "$ctx/Dockerfile"
  docker build -q -t "$tag" "$ctx" >/dev/null 2>&1 || docker build -t "$tag" "$ctx"
  log "built $tag"
}

# The Debian mirror this machine's apt uses (never written into the repo),
# or DEBIAN_MIRROR (a host that is not Debian's has no bookworm mirror).
debian_mirror() {
  local m=${DEBIAN_MIRROR:-}
  [ -n "$m" ] && { echo "$m"; return; }
  grep -qs '^ID=debian' /etc/os-release || { echo "images: not a Debian host: set DEBIAN_MIRROR to a Debian mirror" >&2; exit 1; }
  m=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1)
  [ -n "$m" ] || m=$(grep -hsE '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -1)
  [ -n "$m" ] || { echo "images: no Debian mirror in the apt sources" >&2; exit 1; }
  echo "$m"
}

ROOTFS_PACKAGES=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,jq,procps,containerd,runc,containernetworking-plugins
SUITE=bookworm

# rootfs: Debian with what a kind node runs, as a local image.
rootfs() {
  local key tag dir
  key=$(echo "$SUITE $ROOTFS_PACKAGES" | sha256sum | cut -c1-16)
  tag=gpu-scheduler-kind/rootfs:$key
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { echo "images: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
    dir=$(tmpdir)
    log "debootstrap $SUITE into $dir"
    $SUDO debootstrap --variant=minbase --include="$ROOTFS_PACKAGES" "$SUITE" "$dir" "$(debian_mirror)" >"$dir.log" 2>&1 ||
      { tail -20 "$dir.log" >&2; exit 1; }
    $SUDO rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    # What went in, by version: on the image, for whoever wonders.
    versions=$($SUDO chroot "$dir" dpkg-query -W -f '${Package}=${Version} ' | sha256sum | cut -c1-16)
    # Tagged only once the import is whole: a run stopped halfway leaves no
    # tag that a later run would take as cached.
    $SUDO tar -C "$dir" -c . | docker import --change "LABEL gpu-scheduler.packages=$versions" - "$tag-partial" >/dev/null
    docker tag "$tag-partial" "$tag" && docker rmi "$tag-partial" >/dev/null
    log "imported $tag"
  fi
  echo "$tag"
}

# The control plane's images, tagged as this minor's kubeadm asks for them.
component_images() {
  local rootfs=$1 dir i name
  for i in $("$KBIN/kubeadm" config images list --kubernetes-version "$KUBE_VERSION" | grep -v coredns); do
    name=$(basename "${i%%:*}")
    case $name in
      kube-apiserver|kube-controller-manager|kube-scheduler|etcd) static_image "$i" "$KBIN/$name" ;;
      pause)
        static_image "$i" "$BIN/images/pause"
        docker tag "$i" registry.k8s.io/pause:3.10 # kind's containerd sandbox image
        ;;
      kube-proxy)
        # kube-proxy programs iptables: it runs on the node's own Debian.
        dir=$(tmpdir)
        cp "$KBIN/kube-proxy" "$dir/"
        printf 'FROM %s\nCOPY kube-proxy /usr/local/bin/kube-proxy\n' "$rootfs" > "$dir/Dockerfile"
        docker build -q -t "$i" "$dir" >/dev/null 2>&1 || docker build -t "$i" "$dir"
        log "built $i"
        ;;
      *) echo "images: kubeadm wants $i, which this script does not build" >&2; exit 1 ;;
    esac
  done
}

node() {
  local rootfs key tag ctx kind_src cid images
  make -s "$KBIN/kubelet" "$KBIN/kubeadm" "$KBIN/kubectl" "$KBIN/kube-apiserver" "$KBIN/kube-controller-manager" \
    "$KBIN/kube-scheduler" "$KBIN/kube-proxy" "$KBIN/etcd" "$BIN/crictl" "$BIN/images/pause"
  rootfs=$(rootfs)
  kind_src=$(cd hack/tools/kind && go list -m -f '{{.Dir}}' sigs.k8s.io/kind)
  # The root file system by its image ID: one rebuilt (another day's
  # packages) makes a new node image.
  key=$( {
    echo "$(docker image inspect -f '{{.Id}}' "$rootfs") $KUBE_VERSION $KIND_MOD"
    cat hack/kind/node/Dockerfile hack/kind/node/entrypoint hack/kind/images.sh
    sha256sum "$KBIN"/{kubelet,kubeadm,kubectl,kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy,etcd} "$BIN"/{crictl,images/pause} | cut -d' ' -f1
  } | sha256sum | cut -c1-16)
  tag=gpu-scheduler-kind/node:$KUBE_VERSION-$key
  if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag" > "$BIN/kind-node-image"
    log "node image $tag is cached"
    return
  fi
  ctx=$(tmpdir)
  mkdir -p "$ctx/bin"
  cp -r "$kind_src/images/base/files" "$ctx/base"
  chmod -R u+w "$ctx/base"
  cp hack/kind/node/entrypoint "$ctx/"
  cp "$KBIN"/{kubelet,kubeadm,kubectl} "$BIN/crictl" "$ctx/bin/"
  docker build -q -t "$tag-build" --build-arg ROOTFS="$rootfs" --build-arg KUBE_VERSION=$KUBE_VERSION \
    -f hack/kind/node/Dockerfile "$ctx" >/dev/null 2>&1 ||
    docker build -t "$tag-build" --build-arg ROOTFS="$rootfs" --build-arg KUBE_VERSION=$KUBE_VERSION -f hack/kind/node/Dockerfile "$ctx"
  component_images "$rootfs"
  # Load the images into the node's containerd, as kind build node-image
  # does: containerd runs in a build container, the images are imported
  # without unpacking, and the container is committed.
  cid=$(docker run -d --entrypoint=sleep --security-opt seccomp=unconfined "$tag-build" infinity)
  CONTAINERS+=("$cid")
  docker exec -d "$cid" bash -c 'containerd >/var/log/containerd-build.log 2>&1'
  for _ in $(seq 1 60); do docker exec "$cid" ctr version >/dev/null 2>&1 && break; sleep 1; done
  images=$(docker exec "$cid" kubeadm config images list --kubernetes-version $KUBE_VERSION | grep -v coredns)
  images="$images registry.k8s.io/pause:3.10"
  for i in $images; do
    docker image inspect "$i" >/dev/null 2>&1 || { echo "images: kubeadm wants $i, which was not built" >&2; exit 1; }
    docker save "$i" | docker exec -i "$cid" ctr -n k8s.io images import --no-unpack - >/dev/null
  done
  log "loaded into the node's containerd: $(docker exec "$cid" ctr -n k8s.io images ls -q | tr '\n' ' ')"
  docker exec "$cid" bash -c 'pkill containerd; while pgrep containerd >/dev/null; do sleep 0.2; done; rm -rf /var/log/containerd-build.log /tmp/*'
  docker commit --change 'ENTRYPOINT ["/usr/local/bin/gpu-scheduler-node-entrypoint", "/sbin/init"]' "$cid" "$tag" >/dev/null
  docker rm -f -v "$cid" >/dev/null
  docker rmi "$tag-build" >/dev/null
  echo "$tag" > "$BIN/kind-node-image"
  log "built node image $tag"
}

scheduler() {
  make -s image
}

test_images() {
  local n
  make -s "$BIN/images/pause" "$BIN/images/gpu-workload" "$BIN/images/nvidia-plugin" "$BIN/images/hami-plugin" "$BIN/images/podnet"
  # The workload and pause run as non-root, as the scheduler's image does;
  # the device plugins (a socket in the kubelet's directory) and podnet
  # (the node's routes and CNI configuration) need root.
  static_image gpu-scheduler-e2e/gpu-workload:e2e "$BIN/images/gpu-workload" 65532:65532
  static_image gpu-scheduler-e2e/pause:e2e "$BIN/images/pause" 65532:65532
  for n in nvidia-plugin hami-plugin podnet; do
    static_image gpu-scheduler-e2e/$n:e2e "$BIN/images/$n"
  done
}

case ${1:-all} in
  rootfs) rootfs ;;
  node) node ;;
  scheduler) scheduler ;;
  test) test_images ;;
  all) node; scheduler; test_images ;;
  *) echo "usage: $0 node|scheduler|test|all" >&2; exit 2 ;;
esac
