"""The commands that need no config: `logscan`, `version`, `completion` and `schema`."""

from __future__ import annotations

import argparse
import json
import sys


def cmd_logscan(args: argparse.Namespace) -> int:
    """Any vLLM serve log: how far the load got, how long each step took, and why it failed."""
    import dataclasses

    from ..base import files
    from ..judge import logscan
    limit = 1 << 30  # a serve log of a few days is a few hundred MiB
    try:  # a named file must be a regular one (a FIFO or device would wait or never end); `-` reads a pipe
        raw = sys.stdin.buffer.read(limit + 1) if args.file == "-" else files.read_bytes(args.file, limit)
    except OSError as e:
        print(f"cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    if len(raw) > limit:
        print(f"cannot read {args.file}: more than {limit} bytes", file=sys.stderr)
        return 2
    text = raw.decode("utf-8", errors="replace")
    p = logscan.scan(text)
    steps = logscan.timeline(text)
    if args.json:
        print(json.dumps({"milestone": p.milestone, "progress": p.summary(), "ready": p.ready, "version": p.version,
                          "shards": {"done": p.shards_done, "total": p.shards_total},
                          "seconds_per_shard": p.seconds_per_shard, "eta_s": p.eta_s,
                          "timeline": [dataclasses.asdict(s) for s in steps],
                          "failure": dataclasses.asdict(p.failure) if p.failure else None}, indent=1))
    else:
        print(f"reached: {p.milestone or 'nothing recognisable'} ({p.summary()})"
              + (f", vLLM {p.version}" if p.version else ""))
        for st in steps:
            took = f"{st.seconds:.0f}s" if st.seconds is not None else ""
            print(f"  {st.milestone:<16} {st.at or '?':<15} {took}")
        if p.failure:
            f = p.failure
            print(f"failure: {f.reason} ({'deterministic: retrying will not help' if f.deterministic else 'transient'})")
            print(f"  line: {f.line}")
            print(f"  hint: {f.hint}")
    return 1 if p.failure else 0

def cmd_version(args: argparse.Namespace) -> int:
    from .. import version
    if args.json:
        print(json.dumps({"version": version(), "python": sys.version.split()[0], "executable": sys.executable}))
    else:
        print(f"spark-supervisor {version()} (Python {sys.version.split()[0]}, {sys.executable})")
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    # argcomplete.shellcode, named by its own module (the package does not re-export it for mypy --strict)
    from argcomplete.shell_integration import shellcode
    print(shellcode(["spark-supervisor"], shell=args.shell), end="")
    return 0


def cmd_schema(_args: argparse.Namespace) -> int:  # the parsed arguments every command is given: none here
    from ..config import Config
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **Config.model_json_schema(),
              "title": "spark-supervisor configuration"}
    print(json.dumps(schema, indent=1))
    return 0
