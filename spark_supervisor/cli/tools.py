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
    nccl = _nccl(text)
    if args.json:
        print(json.dumps({"milestone": p.milestone, "progress": p.summary(), "ready": p.ready, "version": p.version,
                          "shards": {"done": p.shards_done, "total": p.shards_total},
                          "seconds_per_shard": p.seconds_per_shard, "eta_s": p.eta_s,
                          "timeline": [dataclasses.asdict(s) for s in steps], "nccl": nccl,
                          "failure": dataclasses.asdict(p.failure) if p.failure else None}, indent=1))
    else:
        print(f"reached: {p.milestone or 'nothing recognisable'} ({p.summary()})"
              + (f", vLLM {p.version}" if p.version else ""))
        for st in steps:
            took = f"{st.seconds:.0f}s" if st.seconds is not None else ""
            print(f"  {st.milestone:<16} {st.at or '?':<15} {took}")
        _print_nccl(nccl)
        if p.failure:
            f = p.failure
            print(f"failure: {f.reason} ({'deterministic: retrying will not help' if f.deterministic else 'transient'})")
            print(f"  line: {f.line}")
            print(f"  hint: {f.hint}")
    return 1 if p.failure else 0

def _nccl(text: str) -> dict[str, object] | None:
    """The network NCCL chose for each rank the log shows (the daemon's reading: logscan.transports), or None
    when the log has no NCCL line at all. ``complete``: whether any rank logged "Init COMPLETE" (the rank
    number is read from that line: without it a rank's network is known, its number not)."""
    if "NCCL INFO" not in text:
        return None
    from ..judge import logscan
    ranks = sorted(logscan.transports(text), key=lambda t: (t.rank is None, t.rank or 0, t.ip))
    return {"complete": any(t.rank is not None for t in ranks),
            "ranks": [{"rank": t.rank, "net": t.net, "interface": t.interface, "ip": t.ip, "host": t.host,
                       "detail": t.detail, "line": t.line} for t in ranks]}


def _print_nccl(nccl: dict[str, object] | None) -> None:
    if nccl is None:
        return
    ranks = nccl["ranks"]
    assert isinstance(ranks, list)
    if not ranks:
        print("nccl: lines found, but no rank says which network it uses (NCCL_DEBUG_SUBSYS without NET?)")
    for r in ranks:
        rank = "rank ?" if r["rank"] is None else f"rank {r['rank']}"
        where = " ".join(x for x in (f"via {r['interface']}" if r["interface"] else "",
                                     f"at {r['ip']}" if r["ip"] else "", f"on {r['host']}" if r["host"] else "") if x)
        print(f"nccl {rank}: {'IB (RDMA)' if r['net'] == 'IB' else r['net']}" + (f" {where}" if where else ""))
    if not nccl["complete"]:
        print("nccl: no rank logged \"Init COMPLETE\": the communicator never finished starting (or the log ends "
              "before it)")


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
