
cd "$1" 2>/dev/null || exit 0
recorded
group() { [ -n "$p" ] && [ ! -e "/proc/$p" ] && kill -0 -"$p" 2>/dev/null; }
if runs || group; then
  kill -TERM -"$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
  i=0
  while { runs || group; } && [ "$i" -lt $(($2 * 10)) ]; do sleep 0.1; i=$((i + 1)); done
  { runs || group; } && kill -KILL -"$p" 2>/dev/null
  runs && kill -KILL "$p" 2>/dev/null
fi
rm -f pid process exit spec started; [ -f log ] && mv -f log log.prev; exit 0
