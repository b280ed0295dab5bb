n=$1 c= p=
trap '[ -z "$p" ] || kill "$p" 2>/dev/null; exit 0' TERM HUP INT
exec 3<&0
{ cat <&3 >/dev/null; kill $$ 2>/dev/null; } >/dev/null 2>&1 &
exec 3<&-
while :; do
  t=$(readlink current 2>/dev/null) || t=
  if [ "$t" != "$c" ]; then
    [ -z "$p" ] || kill "$p" 2>/dev/null; p=
    if [ -n "$t" ] && ok "$t"; then
      { ok "$t" && [ /dev/stdin -ef "$t" ] && exec tail -n "$n" -f; } <"$t" & p=$!; n=+1
    elif [ -n "$t" ]; then echo "$t: not a regular file: not followed" >&2; fi
    c=$t
  fi
  sleep 1 & wait $!
done