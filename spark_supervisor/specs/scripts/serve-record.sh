
stat_field() {  # field $1 of /proc/$2/stat (the command name, field 2, may hold spaces and ")")
  _n=$1; _s=$(cat "/proc/$2/stat" 2>/dev/null) || return 1
  # shellcheck disable=SC2086 # the fields after the command name, split on purpose (numbers: no glob)
  set -- ${_s##*) }
  [ "$#" -ge $((_n - 2)) ] && shift $((_n - 3)) && echo "$1"
}
recorded() {  # sets p (the recorded pid, "" for none) and t (its start time; "ended" once exit is written)
  p= t=
  [ -f pid ] && read -r p <pid
  if [ -f exit ]; then t=ended
  elif [ -f process ]; then read -r p t <process
  else t=legacy
  fi
  case $p in ''|*[!0-9]*) p= ;; esac
}
runs() {
  [ -n "$p" ] || return 1
  case $t in
    legacy) [ "$(stat_field 6 "$p")" = "$p" ] ;;
    ended|'') return 1 ;;
    *) [ "$(stat_field 22 "$p")" = "$t" ] ;;
  esac
}
claim() { echo "$1 $(stat_field 22 "$1")" >process.new && mv -f process.new process && echo "$1" >pid; }
# The end of this wrapper's own instance only: once a stop has forgotten it, or a new launch has claimed the
# record, a late end (this wrapper still between its serve's death and here) must not mark the new one ended.
# The exit code lands whole (a reader never sees an empty exit file).
ended() {
  [ -f process ] && read -r _o _ 2>/dev/null <process && [ "$_o" = "${q:-$$}" ] || return 0
  echo "$1" >exit.new && mv -f exit.new exit; rm -f process
}
