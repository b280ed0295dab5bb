# $1 the partial directory, $2 the destination, $3 a hub cache's refs file to point at $4 ("": none), then
# the files: each renamed from the partial directory to its name in the destination (replacing what was
# there, a dangling link too; -T: never into a directory a name happens to be), then the ref, written whole.
set -e
partial=$1 dest=$2 ref=$3 commit=$4
shift 4
mkdir -p -- "$dest"
for f in "$@"; do
  case $f in */*) mkdir -p -- "$dest/${f%/*}" ;; esac
  mv -f -T -- "$partial/$f" "$dest/$f"
done
rm -rf -- "$partial"
if [ -n "$ref" ]; then
  mkdir -p -- "${ref%/*}"
  printf '%s' "$commit" > "$ref.spark-partial"
  mv -f -T -- "$ref.spark-partial" "$ref"
fi
