#!/bin/busybox sh
# PID 1 of the numa-vm guest, run by static busybox from the initramfs that numa_vm.py builds.
#
# The initramfs holds: busybox, this script, the kernel modules listed in /modules/order (load
# order, dependencies first) and, per run, /job.conf (WORKDIR=...) and /job.sh (the command).
# It mounts the host's root (9p, read-only) under a tmpfs overlay, so every host program and
# Python install works unchanged and writes are thrown away; WORKDIR is shared read-write at the
# same path. The command's stdout/stderr go to the virtio ports numavm.out/numavm.err, and
# "up" and "exit N" lines to numavm.status, which the host polls. Then the guest powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

STATUS=/dev/null
status() { echo "$*" >"$STATUS"; }
halt() { sync; poweroff -f; }
die() { echo "numa-vm guest: $*" >/dev/console; status "error $*"; halt; }

while read -r m; do
    insmod "/modules/$m.ko" || die "cannot load kernel module $m"
done </modules/order

# virtio ports appear as /dev/vportNpM; their names say which is which
for p in /sys/class/virtio-ports/*; do
    case $(cat "$p/name") in
        numavm.out) OUT=/dev/${p##*/} ;;
        numavm.err) ERR=/dev/${p##*/} ;;
        numavm.status) STATUS=/dev/${p##*/} ;;
    esac
done
[ -n "$OUT" ] && [ -n "$ERR" ] && [ "$STATUS" != /dev/null ] || die "virtio ports numavm.out/err/status missing"

. /job.conf
P9=trans=virtio,version=9p2000.L,msize=512000,access=any
R=/mnt/root
mkdir -p /mnt/host /mnt/rw $R
mount -t 9p -o "$P9,ro,cache=loose" hostroot /mnt/host || die "cannot mount the host root (9p)"
mount -t tmpfs -o mode=0755 tmpfs /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/host,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay $R ||
    die "cannot mount the overlay root"
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $R/dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $R/dev/shm   # the guest's own, empty /dev/shm
mount -t tmpfs -o mode=0755 tmpfs $R/run
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup 2>/dev/null   # cpuset tests need cgroup v2
if [ -n "$WORKDIR" ]; then
    mkdir -p "$R$WORKDIR"
    mount -t 9p -o "$P9,cache=mmap" work "$R$WORKDIR" || die "cannot mount the work directory $WORKDIR (9p)"
fi
mkdir -p $R/run/numa-vm
cp /job.sh $R/run/numa-vm/job.sh
hostname numa-vm
ip link set lo up

status up
chroot $R /bin/sh /run/numa-vm/job.sh </dev/null >"$OUT" 2>"$ERR"
status "exit $?"
[ -n "$WORKDIR" ] && umount "$R$WORKDIR"   # flush the shared directory before power-off
halt
