"""Fabric checks before spending 15 minutes on a load, and the day-one qualification (judge.qualify). Pure: config
+ what `ip -o addr` and the host facts showed per node."""

from __future__ import annotations

import ipaddress

from ..config import Config, Deployment
from ..config.view import DeploymentView
from ..model import ImageReport, Kind, Observation
from ..specs import modelprobe
from ..specs.commands import node_env
from . import modelcheck
from .qualify import qualification

_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def parse_ip_addr(text: str) -> dict[str, tuple[str, ...]]:
    """`ip -o addr show`: "2: enp1s0f1np1    inet 192.168.200.12/24 brd ... scope global ..." per line."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("inet", "inet6"):
            out.setdefault(parts[1].split("@")[0], []).append(parts[3])
    return {k: tuple(v) for k, v in out.items()}


def _on(ip: str, cidrs: tuple[str, ...]) -> bool:
    addr = ipaddress.ip_address(ip)
    return any(addr == ipaddress.ip_interface(c).ip or addr in ipaddress.ip_interface(c).network for c in cidrs)


def preflight(view: DeploymentView, obs: Observation) -> list[str]:
    """The fabric as the deployment's members see it (``view``)."""
    dep, members = view.dep, list(view.members)
    problems: list[str] = []
    for node in members:
        env = {**dep.ray.env, **node_env(node), **node.env}
        if env.get("VLLM_HOST_IP") != node.fabric_ip:
            problems.append(f"{node.name}: VLLM_HOST_IP={env.get('VLLM_HOST_IP')} is not its fabric IP {node.fabric_ip}")
        o = obs.nodes.get(node.name)
        ifaces = o.interfaces if o is not None else None
        if ifaces is None:
            continue  # not readable there: a probe error, not a verdict
        if node.fabric_interface:
            if node.fabric_interface not in ifaces:
                problems.append(f"{node.name}: fabric interface {node.fabric_interface} does not exist "
                                f"(has {', '.join(sorted(ifaces))})")
            elif not _on(node.fabric_ip, ifaces[node.fabric_interface]):
                problems.append(f"{node.name}: fabric IP {node.fabric_ip} is not on {node.fabric_interface} "
                                f"({', '.join(ifaces[node.fabric_interface])})")
        elif not any(_on(node.fabric_ip, c) for c in ifaces.values()):
            problems.append(f"{node.name}: fabric IP {node.fabric_ip} is on no interface")
        for var in _IFNAME_VARS:
            for name in filter(None, (env.get(var) or "").split(",")):
                if name.startswith("^"):
                    continue  # an exclusion list
                name = name.lstrip("=")
                if not any(i == name or i.startswith(name) for i in ifaces):
                    problems.append(f"{node.name}: {var}={name} matches no interface")
    per_node = max((n.gpus for n in members), default=0)
    world = dep.serve.tensor_parallel_size * dep.serve.pipeline_parallel_size
    if world > per_node and dep.serve.placement_strategy != "SPREAD":
        problems.append(f"TP x PP = {world} spans nodes with {per_node} GPU each: set placement_strategy = \"SPREAD\"")
    return problems + qualification(view, obs)


def parse_image_probe(node: str, image: str, key: str, out: str) -> ImageReport:
    """commands.IMAGE_PROBE's key=value lines."""
    got: dict[str, str] = {}
    for line in out.splitlines():
        k, sep, v = line.partition("=")
        if sep and k in _PROBE_KEYS and k not in got:
            got[k] = v.strip()
    dash = got.get("ray_dashboard", "")
    vllm_version = got.get("vllm_version", "").split()  # `vllm --version` may print more than the number
    return ImageReport(node, image, key, ray_path=got.get("ray_path", ""), ray_version=got.get("ray_version", ""),
                       ray_python=got.get("ray_python", ""), dashboard=dash == "yes",
                       dashboard_detail=dash.removeprefix("no ").strip() if dash != "yes" else "",
                       vllm_path=got.get("vllm_path", ""), vllm_version=vllm_version[-1] if vllm_version else "", vllm_python=got.get("vllm_python", ""),
                       torch_version=got.get("torch_version", ""), transformers_version=got.get("transformers_version", ""),
                       nccl_version=got.get("nccl_version", ""))


_PROBE_KEYS = {"ray_path", "ray_version", "ray_python", "ray_dashboard", "vllm_path", "vllm_version", "vllm_python",
               "torch_version", "transformers_version", "nccl_version"}


def image_problem(cfg: Config, dep: Deployment, reports: dict[str, ImageReport]) -> tuple[str, str] | None:
    """What in the checked images would fail the start for sure: (reason kind, detail), or None. Mixed
    versions across nodes are refused here, before Ray (or torch's rendezvous) refuses them after a join."""
    members = [n.name for n in cfg.members(dep)]
    got = [reports[n] for n in members if n in reports]
    image = dep.ray.image
    if dep.uses_ray:
        lacking = [r.node for r in got if not r.ray_path]
        if lacking:
            return (Kind.IMAGE_LACKS_RAY, f"{', '.join(lacking)}: no `{dep.ray.command[0]}` in {image} (vLLM's own "
                    "images after 0.19.1 and NVIDIA's NGC vLLM image ship without Ray): build one with "
                    "etc/vllm-ray.Dockerfile (`docker build -t spark-vllm-ray:latest - < vllm-ray.Dockerfile`, then "
                    "`docker save spark-vllm-ray:latest | ssh <worker> docker load`) and name it in deployments.ray.image, "
                    "or set deployments.serve.distributed_executor_backend = \"mp\"")
    lacking = [r.node for r in got if not r.vllm_path]
    if lacking:
        return (Kind.IMAGE_LACKS_VLLM, f"{', '.join(lacking)}: no `{dep.serve.command[0]}` in {image}: set "
                "deployments.serve.command to the image's vLLM entry point")
    fields = [("Ray", "ray_version"), ("Python of Ray", "ray_python")] if dep.uses_ray else []
    fields += [("vLLM", "vllm_version"), ("Python of vLLM", "vllm_python")]
    for what, attr in fields:
        seen = {r.node: getattr(r, attr) for r in got if getattr(r, attr)}
        if len(set(seen.values())) > 1:
            return (Kind.IMAGE_VERSION_MISMATCH, f"{what} differs between nodes ("
                    + ", ".join(f"{n} {v}" for n, v in seen.items()) + f"): the nodes must run the same {what} "
                    f"(pull the same {image} on every node)")
    # With prefetch the planner fills the nodes first; a check put off to the Ray join is made first (both in
    # plan.gates.model_gate), so that the failure names every node.
    if dep.model.check and not dep.model.prefetch and not any(r.model_later and r.model is None for r in got):
        key = modelprobe.key(cfg, dep)
        return modelcheck.problem(cfg, dep, {r.node: r.model for r in got if r.model is not None and r.model.key == key})
    return None
