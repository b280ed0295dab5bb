
cd "$1" 2>/dev/null || exit 3
recorded; r=0
[ ! -f exit ] && runs && r=1
# The first word marks a whole answer: an exec whose output was lost (an empty one, exit 0) is unknown, not "no serve".
echo "serve-state ${p:-0} $(cat spec 2>/dev/null) $(cat started 2>/dev/null) $r $(cat exit 2>/dev/null)"
tail -c "$2" log 2>/dev/null; exit 0
