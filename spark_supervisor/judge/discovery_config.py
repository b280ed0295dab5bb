"""`discover`'s config, pure: the deployment the nodes can serve as a TOML document, every value it set annotated
with where it came from, the [stale] candidates commented out with why, and the steps left to do in order.

The document is a plain dict (what the loader parses) with notes beside it keyed by the value's path, written
by a small TOML writer of our own: comments and commented-out array entries are all it needs beyond tomli-w, and
the text is parsed back by the config loader before it is written anywhere (cli.discover)."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..model import ModelReport
from .discovery import JUMBO_MTU, Candidate, Fabric, ImageChoice, ModelSeen, NodeReading, oom_killers

Path = tuple[str | int, ...]
Doc = dict[str, object]


@dataclass
class Notes:
    """The comments of a document: after a value (``at``), above a table (``above``), and array entries written
    commented out (``off``: the line and why)."""

    at: dict[Path, str] = field(default_factory=dict)
    above: dict[Path, list[str]] = field(default_factory=dict)
    off: dict[Path, list[tuple[str, str]]] = field(default_factory=dict)


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v).replace("\x7f", "\\u007f")  # a JSON string is a TOML basic string, but for DEL
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML for {type(v).__name__}")


def _key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) and k.isascii() else json.dumps(k)


def _is_table(v: object) -> bool:
    return isinstance(v, dict)


def _is_tables(v: object) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(lines: list[str], path: Path, name: str, table: Mapping[str, object], notes: Notes, array: bool) -> None:
    for c in notes.above.get(path, []):
        lines.append(f"# {c}")
    if name:
        lines.append(f"[[{name}]]" if array else f"[{name}]")
    for k, v in table.items():
        if _is_table(v) or _is_tables(v):
            continue
        p = (*path, k)
        off = notes.off.get(p, [])
        note = f"  # {notes.at[p]}" if p in notes.at else ""
        if isinstance(v, list) and off:
            lines.append(f"{_key(k)} = [{note.strip() and ' ' + note.strip()}")
            lines += [f"    {toml_value(x)}," for x in v]
            lines += [f"    # {toml_value(x)},  # {why}" for x, why in off]
            lines.append("]")
        else:
            lines.append(f"{_key(k)} = {toml_value(v)}{note}")
    for k, v in table.items():
        sub = f"{name}.{_key(k)}" if name else _key(k)
        if isinstance(v, dict):
            lines.append("")
            _table(lines, (*path, k), sub, v, notes, False)
        elif _is_tables(v):
            assert isinstance(v, list)
            for i, t in enumerate(v):
                lines.append("")
                _table(lines, (*path, k, i), sub, t, notes, True)


def render(doc: Doc, notes: Notes, head: list[str]) -> str:
    lines = [f"# {h}" if h else "#" for h in head] + [""]
    _table(lines, (), "", doc, notes, False)
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------------------------- building
@dataclass(frozen=True)
class Found:
    """What discovery derived, for the writer."""

    readings: list[NodeReading]
    fabric: Fabric | None
    image: ImageChoice | None
    image_why: list[str]
    models: dict[str, dict[str, ModelSeen]]
    candidates: list[Candidate]
    models_dir: str = ""


def _model_said(m: ModelSeen) -> str:
    r: ModelReport | None = m.report
    if r is None:
        return m.where
    rev = f", revision {r.revision[:12]}" if r.revision else ""
    return f"{r.path or m.where}: {r.files} weight files, {r.bytes / 2**30:.1f} GiB{rev}"


def _node(found: Found, r: NodeReading, base: Mapping[str, object], notes: Notes, path: Path) -> Doc:
    out: Doc = {"name": r.name, "role": r.role}
    notes.at[(*path, "name")] = f"given as {r.target}" + (f" (its hostname: {r.host.hostname})"
                                                          if r.host and r.host.hostname else "")
    side = found.fabric.nodes.get(r.name) if found.fabric else None
    if side is not None:
        shared = f"shared subnet {found.fabric.network}" if found.fabric else ""
        out["fabric_ip"] = side.ip
        notes.at[(*path, "fabric_ip")] = f"from {r.name}: {side.interface} {side.cidr}, {shared}"
        out["fabric_interface"] = side.interface
        notes.at[(*path, "fabric_interface")] = f"from {r.name}: {side.said()}"
    if r.target != "local":
        out["ssh"] = r.target
        out["docker"] = f"ssh://{r.target}"
        notes.at[(*path, "ssh")] = notes.at[(*path, "docker")] = f"given: --worker {r.target}"
    for k, v in base.items():  # the base's node keys win: the testbed's stand-ins, a port, a privilege prefix
        if k in ("name", "role"):
            continue
        if k in out and out[k] != v:
            notes.at[(*path, k)] = f"from --base (discovery found {toml_value(out[k])})"
        else:
            notes.at[(*path, k)] = "from --base"
        out[k] = copy.deepcopy(v)
    return out


def _stale(found: Found, base: Mapping[str, object], notes: Notes) -> Doc:
    out: Doc = copy.deepcopy(dict(base))
    for k in base:
        notes.at[("stale", k)] = "from --base"
    for kind, key in (("unit", "units"), ("container", "containers")):
        listed = out.get(key)
        have = list(listed) if isinstance(listed, list) else []
        off = [(c.name, f"{c.node}: {c.why}") for c in found.candidates if c.kind == kind and c.name not in have]
        out[key] = have
        notes.off[("stale", key)] = off
        if off:
            notes.at[("stale", key)] = "candidates found, commented out: uncomment only what you want stopped and removed"
    notes.above[("stale",)] = [
        "What [stale] names the daemon stops (units) and removes (containers) before each start. Discovery never",
        "enables one: a desktop, a proxy or an operator's own service may hold the GPU or a port.",
    ]
    return out


def _deployment(found: Found, base: Mapping[str, object], notes: Notes) -> Doc:
    p: Path = ("deployments", 0)
    dep: Doc = copy.deepcopy(dict(base))
    for k, v in base.items():
        if not isinstance(v, dict):
            notes.at[(*p, k)] = "from --base"
    dep.setdefault("name", "llm")
    ray = dep.setdefault("ray", {})
    serve = dep.setdefault("serve", {})
    assert isinstance(ray, dict) and isinstance(serve, dict)
    for k in list(ray):
        notes.at[(*p, "ray", k)] = "from --base"
    for k in list(serve):
        notes.at[(*p, "serve", k)] = "from --base"
    if found.image is not None:
        if ray.get("image", found.image.tag) == found.image.tag:
            ray["image"] = found.image.tag
            notes.at[(*p, "ray", "image")] = f"checked: {found.image.said()}"
        ray.setdefault("image_pull", "never")
        notes.at.setdefault((*p, "ray", "image_pull"), "it is on every node already")
    env = ray.setdefault("env", {})
    assert isinstance(env, dict)
    fab = found.fabric
    if fab is not None and fab.rdma and fab.gid_index is not None and "NCCL_IB_GID_INDEX" not in env:
        env["NCCL_IB_GID_INDEX"] = str(fab.gid_index)
        notes.at[(*p, "ray", "env", "NCCL_IB_GID_INDEX")] = (
            "the RoCE v2 GID holding each fabric IP: " + ", ".join(
                f"{n}: {', '.join(f'{q.device} GID {q.gid_index}' for q in s.ports if q.gid_index is not None)}"
                for n, s in fab.nodes.items()))
    if fab is not None and fab.rdma:
        devs = {d for v in fab.devices.values() for d in v}
        per_node = "; ".join(f"{n}: {', '.join(d)}" for n, d in fab.devices.items())
        notes.above[(*p, "ray", "env")] = [
            f"The fabric's RDMA devices: {per_node}. NCCL",
            f"finds them itself; to pin them: NCCL_IB_HCA = \"={','.join(sorted(devs))}\" (a prefix filter otherwise)."]
    model = serve.get("model")
    if not model and found.models:
        name, where = sorted(found.models.items())[0]
        serve["model"] = name
        notes.at[(*p, "serve", "model")] = "complete on every node: " + "; ".join(
            f"{n}: {_model_said(m)}" for n, m in where.items())
        if len(found.models) > 1:
            notes.at[(*p, "serve", "model")] += f" (also there: {', '.join(sorted(found.models)[1:])})"
        if found.models_dir and name.startswith(found.models_dir.rstrip("/") + "/"):
            vols = ray.setdefault("volumes", [])
            mount = f"{found.models_dir}:{found.models_dir}:ro"
            if isinstance(vols, list) and mount not in vols:
                vols.append(mount)
                notes.at[(*p, "ray", "volumes")] = "the models directory, read-only, at the same path"
        serve.setdefault("served_model_name", os.path.basename(name.rstrip("/")))
    if "tensor_parallel_size" not in serve:
        serve["tensor_parallel_size"] = len(found.readings)
        notes.at[(*p, "serve", "tensor_parallel_size")] = f"one rank per node ({len(found.readings)} nodes, one GPU each)"
    return dep


def _mark(notes: Notes, path: Path, value: object) -> None:
    """Every value under ``path`` noted as the base's (discovery's own notes replace them after)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _mark(notes, (*path, k), v)
    elif _is_tables(value):
        assert isinstance(value, list)
        for i, v in enumerate(value):
            _mark(notes, (*path, i), v)
    else:
        notes.at[path] = "from --base"


def build(found: Found, base: Mapping[str, object]) -> tuple[Doc, Notes]:
    """The config's document and its notes. ``base``: the --base file's tables, kept as written."""
    notes = Notes()
    index = {r.name: i for i, r in enumerate(found.readings)}
    for k, v in base.items():
        if k == "nodes" and isinstance(v, list):
            for n in v:
                if isinstance(n, dict) and n.get("name") in index:
                    _mark(notes, ("nodes", index[str(n["name"])]), n)
        elif k == "deployments" and isinstance(v, list) and v:
            _mark(notes, ("deployments", 0), v[0])
        elif k not in ("nodes", "deployments"):
            _mark(notes, (k,), v)
    doc: Doc = {}
    for k, v in base.items():
        if k not in ("nodes", "stale", "deployments"):
            doc[k] = copy.deepcopy(v)
    base_nodes = {str(n.get("name")): n for n in base.get("nodes", []) if isinstance(n, dict)}  # type: ignore[attr-defined]
    doc["nodes"] = [_node(found, r, base_nodes.get(r.name, {}), notes, ("nodes", i)) for i, r in enumerate(found.readings)]
    stale = base.get("stale", {})
    doc["stale"] = _stale(found, stale if isinstance(stale, dict) else {}, notes)
    deps = base.get("deployments") or [{}]
    first = deps[0] if isinstance(deps, list) and deps and isinstance(deps[0], dict) else {}
    doc["deployments"] = [_deployment(found, first, notes)]
    return doc, notes


def todo(found: Found, ray: bool) -> list[str]:
    """What is left before `run` can serve, in the order to do it (the qualification then says the rest)."""
    steps: list[str] = []
    bad = [r for r in found.readings if r.error]
    steps += [f"reach {r.name} ({r.target}): {r.error}" for r in bad]
    if found.fabric is None:
        steps.append("cable the nodes' fabric ports and give each an IPv4 on one shared subnet (no shared subnet found)")
    else:
        if not found.fabric.rdma:
            steps.append(f"fabric {found.fabric.network} has no active RoCE v2 device on every node: NCCL would use TCP "
                         "sockets (check the QSFP cable, `ibdev2netdev`, and that the port is up)")
        if found.fabric.gid_index is None and found.fabric.rdma:
            steps.append("the fabric IPs sit at different GID indexes on the nodes: let NCCL pick (leave "
                         "NCCL_IB_GID_INDEX unset) or renumber so they match")
        steps += [f"{n}: MTU {s.mtu} on {s.interface}: set {JUMBO_MTU} on every fabric interface (netplan), as NVIDIA's "
                  "two-Spark profile does" for n, s in found.fabric.nodes.items() if s.mtu is not None and s.mtu < JUMBO_MTU
                  and found.fabric.rdma]
    for r in found.readings:
        if not r.error and r.runtimes and "nvidia" not in r.runtimes and not r.cdi_dirs:
            steps.append(f"{r.name}: Docker has no NVIDIA runtime and no CDI spec directory: install the NVIDIA "
                         "Container Toolkit (`nvidia-ctk runtime configure --runtime=docker`)")
        steps += [f"{r.name}: {k} runs: it may kill one rank under memory pressure and wedge the pair "
                  f"(`systemctl disable --now {k}`)" for k in oom_killers(r) if k == "earlyoom"]
    if found.image is None:
        steps.append("put one image with vLLM" + (" and Ray" if ray else "") + " on every node (the same ID): "
                     "`docker build -t spark-vllm-ray:latest - < etc/vllm-ray.Dockerfile`, then `docker save "
                     "spark-vllm-ray:latest | ssh <worker> docker load`" + (
                         f" (passed over: {'; '.join(found.image_why)})" if found.image_why else ""))
    if not found.models:
        steps.append("put the model on every node at the same path (e.g. under --models-dir), then discover again")
    if any(c for c in found.candidates):
        steps.append("read the [stale] candidates in the config and uncomment those the daemon should stop and remove")
    return steps
