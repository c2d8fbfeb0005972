#!/usr/bin/env bash
# Builds the kube-ws-proxy container image from nothing but this machine: no base image, no
# registry, no daemon. One layer holds the stripped release binary, the shared libraries it
# links (found with ldd), the CA roots, /etc/passwd and /etc/group with the non-root user
# 65532, and nothing else (no shell). umoci turns that layer into an OCI image layout.
#
# umoci rather than `buildah from scratch` (which works here too, as root): umoci only writes
# files (blobs and JSON), so it needs no container store to fill and clean up, runs the same
# as a non-root user (buildah would need `buildah unshare` and subordinate ids), and with a
# layer tar made here with fixed times the same binary always gives the same digest.
#
# docker/Dockerfile stays the way to build the image with Docker; this script makes the same
# image (user, ports, entrypoint, command) from an existing release binary.
#
# Usage: scripts/build-image.sh [--binary PATH] [--out DIR] [--tag TAG] [--archive FILE]
#   --binary   the release binary (default: $CARGO_TARGET_DIR or target, then release/)
#   --out      OCI image layout directory, replaced if it exists (default: target/image/oci)
#   --tag      image tag inside the layout (default: the crate version)
#   --archive  also write the layout as an oci-archive tar (podman load, skopeo copy)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

binary="${CARGO_TARGET_DIR:-$root/target}/release/kube-ws-proxy"
out="$root/target/image/oci"
tag="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
archive=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --archive) archive="$2"; shift 2 ;;
    *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

for tool in umoci ldd strip tar; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "build-image.sh: $tool is missing (scripts/install-test-deps.sh installs umoci)" >&2
    exit 1
  }
done
[ -x "$binary" ] || { echo "build-image.sh: no binary at $binary (cargo build --release)" >&2; exit 1; }
ca_roots=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca_roots" ] || { echo "build-image.sh: $ca_roots is missing (ca-certificates)" >&2; exit 1; }

# Fixed timestamps make the same inputs give the same image digest.
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}"
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) arch="$(uname -m)" ;;
esac
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/home/nonroot"
chmod 1777 "$rootfs/tmp"

strip --strip-all -o "$rootfs/usr/local/bin/kube-ws-proxy" "$binary"
chmod 0755 "$rootfs/usr/local/bin/kube-ws-proxy"

# Every library ldd resolves, and the dynamic loader, at the path the binary asks for. A
# library ldd cannot find would fail at start inside the image, so it stops the build here.
if ldd "$binary" | grep -q 'not found'; then
  echo "build-image.sh: unresolved libraries:" >&2
  ldd "$binary" >&2
  exit 1
fi
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u |
  while read -r lib; do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
    chmod 0755 "$rootfs$lib"
  done

cp -L "$ca_roots" "$rootfs$ca_roots"
chmod 0644 "$rootfs$ca_roots"
# The login shell named here does not exist in the image: nobody can log in.
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
# Host names resolve from /etc/hosts first, then DNS (the runtime mounts both files).
echo 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"

# Owned by root except the user's home; sorted entries and fixed times for a stable digest.
tar_opts=(--sort=name --mtime="@$epoch" --numeric-owner --format=posix
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime)
tar "${tar_opts[@]}" --owner=0 --group=0 --exclude=./home/nonroot -C "$rootfs" -cf "$work/layer.tar" .
tar "${tar_opts[@]}" --owner=65532 --group=65532 -C "$rootfs" -rf "$work/layer.tar" ./home/nonroot

rm -rf "$out"
mkdir -p "$(dirname "$out")"
umoci init --layout "$out"
umoci new --image "$out:$tag"
umoci raw add-layer --image "$out:$tag" \
  --history.created "$created" --history.created_by "scripts/build-image.sh" "$work/layer.tar"
# The same user, ports, entrypoint and command as docker/Dockerfile.
umoci config --image "$out:$tag" --created "$created" --history.created "$created" \
  --history.created_by "scripts/build-image.sh" \
  --architecture "$arch" --os linux \
  --config.user 65532:65532 \
  --config.workingdir / \
  --config.exposedports 8443/tcp --config.exposedports 8081/tcp \
  --config.entrypoint /usr/local/bin/kube-ws-proxy \
  --config.cmd=--listen --config.cmd=0.0.0.0:8443 \
  --config.cmd=--admin-listen --config.cmd=0.0.0.0:8081 \
  --config.cmd=--log-format --config.cmd=json \
  --config.label "org.opencontainers.image.title=kube-ws-proxy" \
  --config.label "org.opencontainers.image.version=$tag"
# Drops the blobs of the intermediate, unconfigured image.
umoci gc --layout "$out"

if [ -n "$archive" ]; then
  mkdir -p "$(dirname "$archive")"
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner -C "$out" -cf "$archive" .
fi
echo "image: $out:$tag${archive:+ (archive: $archive)}"
