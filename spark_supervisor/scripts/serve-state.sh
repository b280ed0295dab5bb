
cd "$1" 2>/dev/null || exit 3
recorded; r=0
[ ! -f exit ] && runs && r=1
echo "${p:-0} $(cat spec 2>/dev/null) $(cat started 2>/dev/null) $r $(cat exit 2>/dev/null)"
tail -c "$2" log 2>/dev/null; exit 0
