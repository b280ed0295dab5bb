# $1 a directory on a node: each entry under it with links followed ("F", its type as find's %y, its path,
# its size), then each link as it is ("L", its path, its target), NUL-separated. A dangling link is type l.
# Exit 3: no such directory (nothing there yet).
[ -d "$1" ] || exit 3
find -L "$1" -mindepth 1 -printf 'F\0%y\0%P\0%s\0'
a=$?
find "$1" -mindepth 1 -type l -printf 'L\0%P\0%l\0'
b=$?
[ "$a" -eq 0 ] && [ "$b" -eq 0 ]
