
d=$1 h=$2 c=$3 k=$4 m=$5 L=$6 n=$7 lk=$8 lm=$9 q=; shift 9; li=$1; shift
mkdir -p "$d" && cd "$d" || exit 1
recorded
if [ ! -f exit ] && runs; then
  echo "spark-serve: pid $p still runs, not starting a second serve" >&2; exit 75
fi
rm -f exit; [ -f log ] && mv -f log log.prev; rm -f log
echo "$h" >spec; s=$(date -u +%FT%TZ); echo "$s" >started; claim $$
# Whatever ends this shell from here records its end (a failed step, a signal): never "claimed, ended, no code".
# POSIX sh: a special built-in's failed redirection ends it; every such one here is `true`, this is the backstop.
trap 'ended $?' EXIT
f=log
if [ -n "$L" ] && mkdir -p "$L" 2>/dev/null; then
  t=$(echo "$s" | tr -d :-); u=$t
  # shellcheck disable=SC2012 # only names of the wrapper's own form count (sed drops the rest)
  i=$(ls -1 "$L" | sed -n "s/^$t-.*/0/p; s/^${t}_\([0-9][0-9]*\)-.*/\1/p" | sort -n | tail -n 1)
  [ -n "$i" ] && u=${t}_$((i + 1))
  g="$L/$u-$n-$h.log"
  if true >>"$g" 2>/dev/null; then
    f=$g; ln -sfn "$g" log; ln -sfn "${g##*/}" "$L/current"
    # shellcheck disable=SC2010 # ls sorts (C locale); grep keeps the wrapper's own names, which hold no newline
    LC_ALL=C ls -1r "$L" | grep -E '^[0-9]{8}T[0-9]{6}Z(_[0-9]+)?-.+-[0-9A-Za-z]+\.log$' |
      tail -n +$((lk + 1)) | while IFS= read -r x; do
        [ "$L/$x" != "$g" ] && [ -f "$L/$x" ] && [ ! -L "$L/$x" ] && rm -f -- "$L/$x" "$L/$x.1"
      done
  fi
fi
[ -z "$c" ] || cache
setsid "$@" >>"$f" 2>&1 </dev/null & q=$!; claim $q
(
  while kill -0 $q 2>/dev/null; do
    sleep "$li"
    [ "$(wc -c <"$f" 2>/dev/null || echo 0)" -gt $((lm * 1048576)) ] && cp -f "$f" "$f.1" && true >"$f"
  done
) >/dev/null 2>&1 </dev/null & w=$!
wait $q; e=$?; kill $w 2>/dev/null; ended $e
