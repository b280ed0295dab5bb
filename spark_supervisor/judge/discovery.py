"""`discover`'s derivations, pure: from what each node says of itself (its `NodeReading`, read by world.discover)
to the fabric the nodes share, its RDMA devices and GID index, the image and model every node can serve, the
candidates for [stale] (each with why) and what is left to do. Nothing here decides for the operator what to
stop: a candidate is only named, and the config writer comments it out."""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from dataclasses import dataclass, field

from ..model import Container, Gpu, ImageReport, Listener, Memory, ModelReport, Unit
from ..model.host import ROCE_V2, HostFacts

# An image "looks like a vLLM image" when a repository name of it matches one of these (case-insensitive): the
# upstream, NVIDIA's NGC and the community's Spark images, and the Ray-bearing recipe etc/vllm-ray.Dockerfile
# builds. Bounded: at most MAX_IMAGES per node (newest first), so a node full of images costs a few probes only.
VLLM_IMAGE_PATTERNS = ("*vllm*",)
MAX_IMAGES = 6
# Units whose name says they serve a model or run a GPU cluster: what an owner's old stack is made of.
SERVER_UNIT_PATTERNS = ("vllm*", "ray*", "sglang*", "ollama*", "tgi*", "text-generation*", "llama*", "trtllm*",
                        "triton*", "nim*", "litellm*", "open-webui*", "comfyui*")
OOM_UNITS = ("earlyoom", "systemd-oomd")
JUMBO_MTU = 9000  # what a RoCE fabric between two Sparks is set to (NVIDIA's two-Spark profile checks it)


@dataclass(frozen=True)
class ImageSeen:
    """One image on a node's engine that looks like a vLLM image, and its image check (None: not run)."""

    tag: str
    image_id: str
    created: str = ""
    report: ImageReport | None = None
    error: str = ""  # the check could not run (its reason)


@dataclass(frozen=True)
class ModelSeen:
    """A model found on a node's disk (a directory with config.json, or a hub cache repo), and its model check."""

    model: str  # what serve.model would say: a path, or a repo id
    where: str  # the host path it was found at
    source: str  # "dir" or "hub"
    report: ModelReport | None = None
    error: str = ""


@dataclass(frozen=True)
class NodeReading:
    """Everything discover read of one node; a part that could not be read is None (or its error listed)."""

    name: str
    role: str
    target: str  # "local" or the SSH target
    error: str = ""  # the node itself could not be read
    host: HostFacts | None = None
    interfaces: dict[str, tuple[str, ...]] | None = None
    gpu: Gpu | None = None
    memory: Memory | None = None
    docker_version: str = ""
    runtimes: tuple[str, ...] = ()  # docker info's Runtimes
    default_runtime: str = ""
    cdi_dirs: tuple[str, ...] = ()  # docker info's CDISpecDirs: CDI on when there are any
    containers: tuple[Container, ...] = ()
    container_pids: dict[str, tuple[int, ...]] = field(default_factory=dict)  # running container -> host PIDs
    units: tuple[Unit, ...] | None = None
    listening: tuple[Listener, ...] | None = None
    images: tuple[ImageSeen, ...] = ()
    models: tuple[ModelSeen, ...] = ()
    errors: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------- the fabric
@dataclass(frozen=True)
class FabricPort:
    device: str
    port: int
    state: str
    rate_gbps: float | None
    gid_index: int | None  # the RoCE v2 GID holding the node's fabric IP (None: none)


@dataclass(frozen=True)
class FabricNode:
    node: str
    interface: str
    ip: str
    cidr: str  # as `ip -o addr` lists it on the interface
    mtu: int | None
    speed_mbps: int | None
    ports: tuple[FabricPort, ...]

    @property
    def rdma(self) -> bool:
        """An ACTIVE RDMA port of the interface with a RoCE v2 GID for the fabric IP: NCCL can use RDMA."""
        return any(p.state == "ACTIVE" and p.gid_index is not None for p in self.ports)

    def said(self) -> str:
        """Where it came from, for a comment: `enp1s0f1np1 192.168.200.13/24 (rocep1s0f1 port 1 GID 3)`."""
        rdma = ", ".join(f"{p.device} port {p.port} {p.state or '?'}"
                         + (f" GID {p.gid_index}" if p.gid_index is not None else " no RoCE v2 GID") for p in self.ports)
        return f"{self.interface} {self.ip} on {self.cidr}" + (f" ({rdma})" if rdma else " (no RDMA device)")


@dataclass(frozen=True)
class Fabric:
    """A subnet every node has an address of (distinct addresses), and each node's side of it."""

    network: str
    nodes: dict[str, FabricNode]

    @property
    def rdma(self) -> bool:
        return all(n.rdma for n in self.nodes.values())

    @property
    def gid_index(self) -> int | None:
        """The one GID index of the fabric IPs on every node, None when they differ or one has none."""
        found = {p.gid_index for n in self.nodes.values() for p in n.ports if p.state == "ACTIVE"}
        return found.pop() if len(found) == 1 and None not in found else None

    @property
    def devices(self) -> dict[str, tuple[str, ...]]:
        return {name: tuple(sorted({p.device for p in n.ports if p.state == "ACTIVE"})) for name, n in self.nodes.items()}

    @property
    def rank(self) -> tuple[bool, float, int, bool]:
        """Best first: RDMA on every node, then the slowest node's rate, its MTU, and a non-loopback subnet."""
        rate = min((max((p.rate_gbps or 0.0 for p in n.ports), default=0.0) for n in self.nodes.values()), default=0.0)
        mtu = min((n.mtu or 0 for n in self.nodes.values()), default=0)
        return self.rdma, rate, mtu, not ipaddress.ip_network(self.network).is_loopback


def _candidates(r: NodeReading) -> list[tuple[str, FabricNode]]:
    """(network, side) for every IPv4 the node has: each interface's own addresses, and the IPv4s its RoCE v2
    GIDs hold inside the interface's subnet (one interface may carry several fabric addresses)."""
    if r.interfaces is None:
        return []
    host = r.host or HostFacts()
    out: list[tuple[str, FabricNode]] = []
    for ifname, cidrs in sorted(r.interfaces.items()):
        link = host.link(ifname)
        for cidr in cidrs:
            try:
                iface = ipaddress.ip_interface(cidr)
            except ValueError:
                continue
            if iface.version != 4 or iface.ip.is_link_local:
                continue
            gid_ips = {g.ipv4 for p in host.rdma for g in p.gids if g.netdev == ifname and g.type == ROCE_V2
                       and g.ipv4 and ipaddress.ip_address(g.ipv4) in iface.network}
            for ip in sorted(gid_ips | ({str(iface.ip)} if not gid_ips or not iface.ip.is_loopback else set())):
                ports = tuple(FabricPort(p.device, p.port, p.state, p.rate_gbps, p.roce_v2_index(ip))
                              for p in host.ports_on(ifname, ip))
                out.append((str(iface.network), FabricNode(r.name, ifname, ip, cidr, link.mtu if link else None,
                                                           link.speed_mbps if link else None, ports)))
    return out


def fabrics(readings: list[NodeReading]) -> list[Fabric]:
    """Every subnet all the nodes share with a distinct address each, best first (Fabric.rank). On one node, the
    side with RDMA is preferred to one without."""
    by_net: dict[str, dict[str, list[FabricNode]]] = {}
    for r in readings:
        for net, side in _candidates(r):
            by_net.setdefault(net, {}).setdefault(r.name, []).append(side)
    found: list[Fabric] = []
    for net, sides in by_net.items():
        if len(sides) != len(readings):
            continue
        chosen = {name: sorted(s, key=lambda n: (not n.rdma, n.interface, n.ip))[0] for name, s in sides.items()}
        if len({n.ip for n in chosen.values()}) != len(chosen):
            continue  # the same address everywhere (loopback, a Docker bridge): not a network between them
        found.append(Fabric(net, {r.name: chosen[r.name] for r in readings}))
    return sorted(found, key=lambda f: f.rank, reverse=True)


# --------------------------------------------------------------------------------------------- images, models
def looks_like_vllm(tag: str) -> bool:
    repo = tag.rsplit(":", 1)[0] if "/" not in tag.rsplit(":", 1)[-1] else tag
    return any(fnmatch.fnmatch(repo.lower(), p) for p in VLLM_IMAGE_PATTERNS)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


@dataclass(frozen=True)
class ImageChoice:
    tag: str
    image_id: str  # the same on every node ("": built on each, other IDs with the same versions)
    reports: dict[str, ImageReport]

    def said(self) -> str:
        r = next(iter(self.reports.values()))
        ident = self.image_id[:19] if self.image_id else "other IDs, same versions"
        return (f"{self.tag} ({ident}) on {', '.join(self.reports)}: vllm {r.vllm_version or '?'}, "
                + (f"ray {r.ray_version or '?'}" if r.ray_path else "no ray"))


def choose_image(readings: list[NodeReading], ray: bool, prefer: str = "") -> tuple[ImageChoice | None, list[str]]:
    """The image to serve with: on every node with the same vLLM and Ray versions, vLLM in it (and Ray, for the Ray backend); the
    one named by ``prefer`` (the base config's) if it qualifies, else the newest vLLM. And why each other was
    passed over."""
    tags = {i.tag for r in readings for i in r.images}
    fit: list[ImageChoice] = []
    why: list[str] = []
    for tag in sorted(tags):
        seen = {r.name: next((i for i in r.images if i.tag == tag), None) for r in readings}
        lacking = [n for n, i in seen.items() if i is None]
        if lacking:
            why.append(f"{tag}: not on {', '.join(lacking)}")
            continue
        ids = {i.image_id for i in seen.values() if i is not None}
        reports = {n: i.report for n, i in seen.items() if i is not None and i.report is not None}
        errors = [f"{n}: {i.error}" for n, i in seen.items() if i is not None and i.error]
        if errors or len(reports) != len(readings):
            why.append(f"{tag}: image check failed: {'; '.join(errors) or 'not run'}")
            continue
        if any(not r.vllm_path for r in reports.values()):
            why.append(f"{tag}: no vllm in it")
            continue
        if ray and any(not r.ray_path for r in reports.values()):
            why.append(f"{tag}: no ray in it (the Ray backend needs it: etc/vllm-ray.Dockerfile adds it)")
            continue
        versions = {(r.vllm_version, r.ray_version) for r in reports.values()}
        if len(versions) > 1:  # what the daemon's image check refuses too (judge.preflight.image_problem)
            why.append(f"{tag}: other vLLM or Ray versions on the nodes (docker save | docker load one of them)")
            continue
        fit.append(ImageChoice(tag, ids.pop() if len(ids) == 1 else "", reports))
    fit.sort(key=lambda c: (c.tag == prefer, _version(next(iter(c.reports.values())).vllm_version)), reverse=True)
    return (fit[0] if fit else None), why


def complete_models(readings: list[NodeReading]) -> dict[str, dict[str, ModelSeen]]:
    """model -> node -> what was found, for the models every node holds complete (by the model check)."""
    found: dict[str, dict[str, ModelSeen]] = {}
    for r in readings:
        for m in r.models:
            if m.report is not None and not m.report.missing and not m.report.unchecked:
                found.setdefault(m.model, {})[r.name] = m
    return {k: v for k, v in found.items() if len(v) == len(readings)}


# ------------------------------------------------------------------------------------------ stale candidates
@dataclass(frozen=True)
class Candidate:
    node: str
    kind: str  # "unit" or "container"
    name: str
    why: str


def stale_candidates(r: NodeReading, ports: tuple[int, ...]) -> list[Candidate]:
    """What on the node could hold the GPU or a port the deployment needs: running containers that hold a GPU
    process, listen on one of ``ports`` or run a vLLM image; loaded units named like a model server that are
    enabled or active. Containers with a label of ours are the daemon's own (never candidates)."""
    out: list[Candidate] = []
    gpu_pids = {p.pid: p for p in (r.gpu.processes if r.gpu else ())}
    listeners = {x.pid: x for x in r.listening or () if x.pid is not None and x.port in ports}
    for c in r.containers:
        if any(k.startswith("spark-supervisor") for k in c.labels) or not c.running:
            continue
        pids = set(r.container_pids.get(c.name, ()))
        why = [f"GPU process {gpu_pids[p].name} (pid {p}, {gpu_pids[p].used_mib} MiB)" for p in sorted(pids & set(gpu_pids))]
        why += [f"listens on port {listeners[p].port}" for p in sorted(pids & set(listeners))]
        if looks_like_vllm(c.image):
            why.append(f"runs a vLLM image ({c.image})")
        if why:
            out.append(Candidate(r.name, "container", c.name, "; ".join(why)))
    for u in r.units or ():
        if u.loaded != "loaded" or u.name in OOM_UNITS:
            continue
        if any(fnmatch.fnmatch(u.name, p) for p in SERVER_UNIT_PATTERNS) and (u.enabled == "enabled" or u.active == "active"):
            out.append(Candidate(r.name, "unit", u.name, f"{u.enabled or '?'}, {u.active or '?'}: named like a model "
                                 "server; would start again at boot and take the GPU"))
    return out


def oom_killers(r: NodeReading) -> list[str]:
    """An active earlyoom or systemd-oomd: by its running process (host facts), or its unit active."""
    seen = set(r.host.oom_killers if r.host else ())
    seen |= {u.name for u in r.units or () if u.name in OOM_UNITS and u.active == "active"}
    return sorted(seen)
