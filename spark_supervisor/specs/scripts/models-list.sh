# The models on a node's disk, for `discover` (world.discover): "dir:<path>" for each directory right under the
# models directory ($1, "" for none) that holds a config.json, then "hub:<repo>" for each Hugging Face cache repo
# with snapshots in each hub cache given ($2...) and the login user's own. Reads only; at most 200 lines.
d=$1
shift
{
  if [ -n "$d" ] && [ -d "$d" ]; then
    for m in "$d"/*/; do
      [ -f "${m}config.json" ] && echo "dir:${m%/}"
    done
  fi
  for c in "$@" "${HOME:-/nonexistent}/.cache/huggingface/hub"; do
    [ -d "$c" ] || continue
    for r in "$c"/models--*; do
      [ -d "$r/snapshots" ] && echo "hub:$r"
    done
  done
} | head -n 200
exit 0
