# A node's fabric and identity facts (wire-formats.md §8.2), read under the root given ($1: "/" on a host).
# Prints "host-facts", then "<path>:<first line>" per file, paths relative to the root. grep reads each
# file's first line only (-m1; a sysfs attribute is at most a page), skips devices, FIFOs and sockets
# (-D skip) and directories (-d skip), and leaves out what cannot be read (-s: an empty GID slot's type, the
# carrier of a link that is down); the empty GID slots (all zeros) are left out of the answer.
cd "$1" || exit 3
echo host-facts
set -- proc/sys/kernel/random/boot_id etc/machine-id \
  sys/class/net/*/operstate sys/class/net/*/mtu sys/class/net/*/speed \
  sys/class/infiniband/*/fw_ver sys/class/infiniband/*/ports/*/state sys/class/infiniband/*/ports/*/rate \
  sys/class/infiniband/*/ports/*/gids/* sys/class/infiniband/*/ports/*/gid_attrs/types/* \
  sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*
grep -D skip -d skip -s -m1 -H '' "$@" | grep -v ':0000:0000:0000:0000:0000:0000:0000:0000$'
exit 0
