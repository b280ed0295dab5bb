# $1 the partial directory (beside the destination, so on its filesystem): emptied of an interrupted copy's
# files, then the tar stream on standard input unpacked into it. Nothing reaches the destination's names here.
set -e
rm -rf -- "$1"
mkdir -p -- "$1"
exec tar -x -f - -C "$1" --no-same-owner
