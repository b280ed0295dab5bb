# $1 a directory, then the files in it to hash: sha256sum's lines ("<hex>  <name>").
cd -- "$1" || exit
shift
exec sha256sum -- "$@"
