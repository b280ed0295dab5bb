
cd "$1" 2>/dev/null || exit 3
# One consistent reading: running, ended with its exit code, or nothing recorded. A serve that is not running
# and has no exit code yet is its wrapper between two steps (its serve just died and its end is being written,
# or a launch under way): read again, briefly, rather than answer "ended, code unknown" for it.
i=0
while :; do
  recorded; r=0 x=
  if [ "$t" = ended ]; then x=$(cat exit 2>/dev/null)
  elif runs; then r=1
  fi
  { [ "$r" = 1 ] || [ -n "$x" ] || [ -z "$p" ]; } && break
  i=$((i + 1)); [ "$i" -ge 20 ] && break
  sleep 0.05
done
# The first word marks a whole answer: an exec whose output was lost (an empty one, exit 0) is unknown, not "no serve".
echo "serve-state ${p:-0} $(cat spec 2>/dev/null) $(cat started 2>/dev/null) $r $x"
tail -c "$2" log 2>/dev/null; exit 0
