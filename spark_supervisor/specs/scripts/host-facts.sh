# A node's fabric and identity facts (docs/wire-formats.md §8.2), read under the root given ($1: "/" on a host).
# Prints "host-facts", the running kernel and node name ("uname_r:<uname -r>", "hostname:<uname -n>": of the
# machine the script runs on, whatever the root), "absent:<file>" for each release file that is not there at
# all (not there is "none"; there but unreadable stays unknown), the release files' identifying lines, then
# "<path>:<first line>" per file, paths relative to the root. grep reads each sysfs file's first line only
# (-m1; a sysfs attribute is at most a page), skips devices, FIFOs and sockets (-D skip) and directories
# (-d skip), and leaves out what cannot be read (-s: an empty GID slot's type, the carrier of a link that is
# down); the empty GID slots (all zeros) are left out of the answer, and every line of it is cut at 512
# characters (a file without a newline under the root still reaches the daemon bounded). Last, the user-space
# OOM killers that run, by their processes' names.
cd "$1" || exit 3
echo host-facts
echo "uname_r:$(uname -r)"
echo "hostname:$(uname -n)"
os=etc/os-release  # os-release(5): /etc's, else /usr/lib's
[ -e "$os" ] || [ -L "$os" ] || os=usr/lib/os-release
[ -e "$os" ] || [ -L "$os" ] || echo "absent:etc/os-release"
[ -e etc/dgx-release ] || [ -L etc/dgx-release ] || echo "absent:etc/dgx-release"
grep -D skip -d skip -s -m8 -H -E '^(PRETTY_NAME|VERSION_ID|DGX_NAME|DGX_PRETTY_NAME|DGX_OS_VERSION|DGX_SWBUILD_VERSION)=' \
  "$os" etc/dgx-release | cut -c -512
set -- proc/sys/kernel/random/boot_id etc/machine-id \
  sys/class/net/*/operstate sys/class/net/*/mtu sys/class/net/*/speed \
  sys/class/infiniband/*/fw_ver sys/class/infiniband/*/ports/*/state sys/class/infiniband/*/ports/*/rate \
  sys/class/infiniband/*/ports/*/gids/* sys/class/infiniband/*/ports/*/gid_attrs/types/* \
  sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*
grep -D skip -d skip -s -m1 -H '' "$@" | cut -c -512 | grep -v ':0000:0000:0000:0000:0000:0000:0000:0000$'
# User-space OOM killers that run (a process's comm, whole-line match): "proc/<pid>/comm:<name>".
grep -D skip -d skip -s -x -H -E 'earlyoom|systemd-oomd' proc/[0-9]*/comm | cut -c -512
exit 0
