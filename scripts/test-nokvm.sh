#!/usr/bin/env bash
# Runs a command (default: make test) where /dev/kvm does not exist, even on
# a host that has one: a private mount namespace whose /dev is a fresh tmpfs
# holding only the nodes the tests use, bound from the real /dev. Machines
# of our kind differ (some have a nested /dev/kvm, some none); this proves
# the suite passes on the second kind from any of them. Needs root (or
# CAP_SYS_ADMIN) for unshare and mount.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -gt 0 ] || set -- make test

if [ "${III_IN_NOKVM_NS:-}" != 1 ]; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo --preserve-env)
  exec "${as_root[@]}" env III_IN_NOKVM_NS=1 unshare --mount --propagation private "$0" "$@"
fi

# Inside the namespace: keep the real /dev reachable, then lay a new one.
real="$(mktemp -d /tmp/iii-realdev.XXXXXX)"
mount --bind /dev "$real"
mount -t tmpfs -o mode=0755,size=16m nokvm-dev /dev
for n in null zero full random urandom tty; do
  [ -e "$real/$n" ] || continue
  touch "/dev/$n"
  mount --bind "$real/$n" "/dev/$n"
done
# Nodes some tests use when the host has them: TUN for network namespaces,
# vsock for guest channels where the host has it.
for n in net/tun vsock vhost-vsock; do
  [ -e "$real/$n" ] || continue
  mkdir -p "/dev/$(dirname "$n")"
  touch "/dev/$n"
  mount --bind "$real/$n" "/dev/$n"
done
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
ln -s pts/ptmx /dev/ptmx
mount -t tmpfs -o mode=1777 shm /dev/shm
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
umount -l "$real" && rmdir "$real"

if [ -e /dev/kvm ]; then
  echo "test-nokvm: /dev/kvm is still visible; refusing to run" >&2
  exit 1
fi
echo "test-nokvm: /dev is a fresh tmpfs without kvm: $(ls /dev | tr '\n' ' ')"
cd "$root"
exec "$@"
