
spec_hash() { case $1 in *[!0-9a-f]*) return 1 ;; HASH_GLOB) return 0 ;; *) return 1 ;; esac; }
made() {
  spec_hash "${1##*/}" && [ -d "$1" ] && [ ! -L "$1" ] && [ -f "$1/$M" ] && [ ! -L "$1/$M" ]
}
others() {  # the other specs' caches the wrapper made, the most recently launched first
  (cd "$c" && ls -1t -- */"$M" 2>/dev/null) | while IFS= read -r x; do
    x=${x%/*}; [ "$x" != "$h" ] && made "$c/$x" && echo "$x"
  done
}
# shellcheck disable=SC2046 # one name per line, split on purpose: spec-hash names (hex, no glob)
size() { (cd "$c" && du -smc -- "$h" $(others) 2>/dev/null) | tail -n 1 | cut -f1; }
not_ours() {
  x="spark-serve: NOT_OURS: $1; set deployments.serve.cache_dir to a directory of its own, or empty this one"
  echo "$x" >>"$f"; echo "$x" >&2; ended NOT_OURS_EXIT; exit NOT_OURS_EXIT
}
cache() {
  M=CACHE_MARK
  spec_hash "$h" || { echo "spark-serve: not a spec hash: $h" | tee -a "$f" >&2; ended 2; exit 2; }
  [ -L "$c" ] && not_ours "$c is a symbolic link"
  mkdir -p "$c" || return 0
  # Removed under the running container (its mount is the deleted directory): nothing can be made in it until
  # the container is made anew. Tried in a subshell: a redirection that fails must not end the wrapper.
  if ! (: >"$c/.spark-supervisor-probe") 2>/dev/null; then
    x="spark-serve: CacheDirGone: $c cannot be written (removed under the running container?)"
    echo "$x" >>"$f"; echo "$x" >&2; ended 74; exit 74
  fi
  rm -f "$c/.spark-supervisor-probe"
  if [ ! -f "$c/$M" ] || [ -L "$c/$M" ]; then
    for x in "$c"/* "$c"/.[!.]* "$c"/..?*; do
      [ -e "$x" ] || [ -L "$x" ] || continue
      spec_hash "${x##*/}" && [ -d "$x" ] && [ ! -L "$x" ] && continue
      not_ours "$c holds files spark-supervisor did not create (${x##*/})"
    done
    true >"$c/$M"
  fi
  e=$c/$h
  if mkdir "$e" 2>/dev/null; then true >"$e/$M"
  elif [ -L "$e" ] || [ ! -d "$e" ]; then not_ours "$e is not a directory spark-supervisor made"
  fi
  mkdir -p "$e/tmp"; made "$e" && touch "$e/$M"
  # shellcheck disable=SC2115 # $c is never empty (the wrapper calls cache only with one), $x a name others printed
  others | tail -n +"$k" | while IFS= read -r x; do rm -rf -- "$c/$x"; done
  # shellcheck disable=SC2115 # as above
  while [ "$(size)" -gt "$m" ] 2>/dev/null; do
    x=$(others | tail -n 1); [ -n "$x" ] && rm -rf -- "$c/$x" && [ ! -e "$c/$x" ] || break
  done
}
