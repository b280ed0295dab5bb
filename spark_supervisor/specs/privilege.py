"""What the daemon runs as root on a node, as data: the commands behind a node's privilege prefix ([[nodes]]
become) under a config, and the narrowest sudoers rule that allows exactly them (docs/privileges.md)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..config import Config, Node
from . import commands

# Where the programs are on Ubuntu (DGX OS) and Debian; sudo also matches another path to the same file.
PATHS = {"systemctl": "/usr/bin/systemctl", "sysctl": "/usr/sbin/sysctl"}
ALIAS = "SPARK_SUPERVISOR"


def root_commands(cfg: Config, node: Node) -> list[list[str]]:
    """The commands the daemon may run on ``node`` that need root, without the prefix, in the order it runs
    them: each [stale] unit stopped, then disabled or masked when the config says so; then the page-cache
    drop's write, on a worker whose drop is the built-in one ([memory] page_cache = "drop"). The head's
    drop runs in a container (Docker), a node's own drop_caches command as the operator wrote it."""
    out: list[list[str]] = []
    for unit in cfg.stale.units:
        out.append(commands.systemctl("stop", [unit]))
        if cfg.stale.mask or cfg.stale.disable:
            out.append(commands.systemctl("mask" if cfg.stale.mask else "disable", [unit]))
    if cfg.memory.page_cache == "drop" and node.remote and not node.drop_caches:
        out.append(list(commands.DROP_CACHES_SYSCTL))
    return out


_SUDOERS_SPECIAL = re.compile(r"([,:=\\])")


def _arg(a: str) -> str:
    """One argument as a sudoers Cmnd writes it: ',', ':', '=' and '\\' escaped (sudoers(5))."""
    return _SUDOERS_SPECIAL.sub(r"\\\1", a)


def sudoers_rule(user: str, argvs: list[list[str]], paths: Mapping[str, str] | None = None) -> str:
    """The sudoers lines that let ``user`` run exactly ``argvs`` as root without a password, and nothing
    else: each command by its absolute path with all its arguments (sudo then refuses any other argument).
    For /etc/sudoers.d/spark-supervisor, checked with `visudo -cf`. ``paths``: where each program is on the
    node (PATHS when not given)."""
    where = {**PATHS, **(paths or {})}
    cmnds = []
    for argv in argvs:
        prog = where.get(argv[0], argv[0]) if not os.path.isabs(argv[0]) else argv[0]
        cmnds.append(" ".join([prog, *(_arg(a) for a in argv[1:])]))
    body = ", \\\n    ".join(dict.fromkeys(cmnds))
    return (f"# spark-supervisor: the commands it runs as root on this node (docs/privileges.md)\n"
            f"Cmnd_Alias {ALIAS} = {body}\n"
            f"{user} ALL=(root) NOPASSWD: {ALIAS}\n")
