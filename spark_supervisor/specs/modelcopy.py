"""`copy-model`'s commands, as data: the listing of a model directory on a node, the tar stream from the head
(links followed) into a partial directory beside the destination, the sha256 of what arrived, and the renames
into place once all of it is whole (world.modelcopy runs them; judge.modelcopy reads what they print)."""

from __future__ import annotations

import posixpath

from ..adapters.shell import ssh_options
from . import script

LIST = script.load("model-copy-list.sh")
SINK = script.load("model-copy-sink.sh")
HASH = script.load("model-copy-hash.sh")
FINISH = script.load("model-copy-finish.sh")
PARTIAL = ".spark-partial"


def list_argv(directory: str) -> list[str]:
    return ["sh", "-c", LIST, "spark-copy-list", directory]


def source_argv(directory: str, names: list[str]) -> list[str]:
    """The files as one tar stream on standard output. --dereference: a hub snapshot's files are links into
    blobs/, and a copy of the links alone is a folder of dangling links with no weights."""
    return ["tar", "-C", directory, "--dereference", "-c", "-f", "-", "--", *names]


def sink_argv(partial: str) -> list[str]:
    return ["sh", "-c", SINK, "spark-copy-sink", partial]


def hash_argv(directory: str, names: list[str]) -> list[str]:
    return ["sh", "-c", HASH, "spark-copy-hash", directory, *names]


def finish_argv(partial: str, dest: str, ref: str, commit: str, names: list[str]) -> list[str]:
    return ["sh", "-c", FINISH, "spark-copy-finish", partial, dest, ref, commit, *names]


def partial_dir(dest: str) -> str:
    """Beside the destination (its filesystem, so the final renames are renames) and hidden from the model
    check, which looks only inside the destination."""
    parent, base = posixpath.split(dest.rstrip("/"))
    return posixpath.join(parent, f".{base}{PARTIAL}")


def over_fabric(argv: list[str], fabric_ip: str, key_alias: str) -> list[str]:
    """An ssh argument list (adapters.shell.ssh_argv: ``ssh OPTIONS TARGET -- COMMAND``) sent to the node's
    fabric address instead of its ssh target's: the same user, port and keys, the host key checked as the one
    known for the target (HostKeyAlias), since it is the same host on another link."""
    if len(argv) < 4 or argv[0] != "ssh" or argv[-2] != "--":
        raise ValueError(f"not an ssh argument list: {argv[:2]}")
    return [*argv[:-3], "-o", f"HostName={fabric_ip}", "-o", f"HostKeyAlias={key_alias}", *argv[-3:]]


def key_alias(ssh_g: str, target: str) -> str:
    """The name ssh(1) files the target's host key under (its `ssh -G` output): HostKeyAlias when set, else
    the host name, with the port when not 22 ("[host]:port")."""
    conf = ssh_options(ssh_g)
    if conf.get("hostkeyalias", "none") != "none":
        return conf["hostkeyalias"]
    host, port = conf.get("hostname", target), conf.get("port", "22")
    return host if port == "22" else f"[{host}]:{port}"
