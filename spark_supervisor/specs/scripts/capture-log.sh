# After logs-safe.sh (in the node's log directory, ok() defined): for `report --capture`, one launch's files in order
# ($4...), read as the daemon's log reads do (regular files, no links), cut to what the capture keeps. $1 "head":
# the first $2 bytes (the startup log); $1 "nccl": the first $2 lines holding "NCCL INFO", each cut at $3 bytes.
mode=$1 n=$2 cut=$3; shift 3
for f in "$@"; do ok "$f" && { ok "$f" && [ /dev/stdin -ef "$f" ] && cat; } <"$f" || echo "$f: not a regular file: not read" >&2; done |
  if [ "$mode" = nccl ]; then grep -a -F "NCCL INFO" | cut -b "-$cut" | head -n "$n"; else head -c "$n"; fi
exit 0