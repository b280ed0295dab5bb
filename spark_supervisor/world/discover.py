"""`discover`'s eyes: each node read with what the daemon already reads (a full observation: containers, the
host facts, `ip -o addr`, nvidia-smi, meminfo, listeners), plus the engine's runtimes and CDI, its images that
look like vLLM images and their image check, the models on its disk and their model check, and the units named
like a model server. It changes nothing on a node: besides reads, it runs only the image and model checks'
short-lived, no-network probe containers (a dry Actor: no pull, no state file), which remove themselves."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import structlog

from ..adapters import AdapterError, guarded, within
from ..config import Config, parse
from ..config.view import DeploymentView
from ..judge.discovery import (
    MAX_IMAGES,
    OOM_UNITS,
    SERVER_UNIT_PATTERNS,
    ImageSeen,
    ModelSeen,
    NodeReading,
    looks_like_vllm,
)
from ..model import CheckImage, CheckModel, ImageReport, ModelReport
from ..specs import commands, script
from .act import ActionFailed, Actor
from .observe import NodeAdapters, World, _units, observe_node

MODELS_LIST = script.load("models-list.sh")
PLACEHOLDER_MODEL = "/nonexistent/discover-placeholder"  # the probe config's model until one is chosen


@dataclass(frozen=True)
class Target:
    name: str
    role: str  # "head" or "worker"
    target: str  # "local" or an SSH target


def probe_config(base: Mapping[str, object], targets: list[Target], state_dir: str, *, image: str = "",
                 model: str = "", models_dir: str = "") -> Config:
    """The config discover reads the nodes with: the base's tables, the targets as nodes (the base's overrides
    of each applied), placeholder fabric addresses (nothing is started on them), no pull, a state directory
    of its own. Raises ConfigError when the base does not make a config."""
    base_nodes = {str(n.get("name")): n for n in base.get("nodes", []) or [] if isinstance(n, dict)}  # type: ignore[attr-defined]
    nodes = []
    for i, t in enumerate(targets):
        n: dict[str, object] = {"name": t.name, "role": t.role, "fabric_ip": f"192.0.2.{i + 1}"}
        if t.target != "local":
            n.update(ssh=t.target, docker=f"ssh://{t.target}")
        n.update({k: v for k, v in base_nodes.get(t.name, {}).items() if k not in ("fabric_ip", "fabric_interface")})
        nodes.append(n)
    deps = base.get("deployments") or [{}]
    dep = dict(deps[0]) if isinstance(deps, list) and isinstance(deps[0], dict) else {}
    ray = {**dict(dep.get("ray") or {}), "image_pull": "never"}
    if image:
        ray["image"] = image
    mount = f"{models_dir}:{models_dir}:ro"
    vols = ray.get("volumes")
    vols = list(vols) if isinstance(vols, list) else []
    if models_dir and mount not in vols:
        ray["volumes"] = [*vols, mount]
    serve = {**dict(dep.get("serve") or {})}
    serve["model"] = model or serve.get("model") or PLACEHOLDER_MODEL
    doc = {**{k: v for k, v in base.items() if k not in ("nodes", "deployments")}, "nodes": nodes,
           "deployments": [{**dep, "ray": ray, "serve": serve}]}
    sup = dict(doc.get("supervisor") or {})  # type: ignore[call-overload]
    doc["supervisor"] = {**sup, "state_dir": state_dir}
    return parse(doc, "discover")


def _images(a: NodeAdapters, also: str, timeout: float) -> list[tuple[str, str, str]]:
    """(tag, ID, created) of the engine's images that look like vLLM images, newest first, at most MAX_IMAGES;
    and ``also`` (the base's image) wherever it is."""
    rows = within(lambda: a.docker.client().api.images(), timeout, f"images on {a.node.name}")
    found: list[tuple[int, str, str]] = []
    for row in rows:
        for tag in row.get("RepoTags") or []:
            if tag == also or looks_like_vllm(tag):
                found.append((int(row.get("Created") or 0), tag, str(row.get("Id", ""))))
    found.sort(reverse=True)
    keep = [f for f in found if f[1] == also] + [f for f in found if f[1] != also][:MAX_IMAGES]
    return [(tag, iid, str(created)) for created, tag, iid in keep]


def _engine(a: NodeAdapters, timeout: float) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """docker info: the runtimes, the default one and the CDI spec directories."""
    info = within(lambda: a.docker.client().info(), timeout, f"docker info on {a.node.name}")
    return (tuple(sorted(info.get("Runtimes") or {})), str(info.get("DefaultRuntime", "")),
            tuple(info.get("CDISpecDirs") or ()))


def _model_places(a: NodeAdapters, models_dir: str) -> list[tuple[str, str, str]]:
    """(model, host path, source) of each model on the node's disk (MODELS_LIST)."""
    env = a.node.env
    caches = [c for c in (env.get("HF_HUB_CACHE", ""), f"{env['HF_HOME']}/hub" if env.get("HF_HOME") else "",
                          "/root/.cache/huggingface/hub") if c]
    r = a.shell.run(["sh", "-c", MODELS_LIST, "models-list", models_dir, *caches])
    out = []
    for line in r.out.splitlines():
        kind, _, path = line.partition(":")
        if kind == "dir":
            out.append((path, path, "dir"))
        elif kind == "hub" and "/models--" in path:
            out.append((path.rsplit("/models--", 1)[1].replace("--", "/", 1), path.rsplit("/", 1)[0], "hub"))
    return list(dict.fromkeys(out))


def _read_node(world: World, name: str, t: Target, models_dir: str) -> NodeReading:
    a, view = world.nodes[name], world.view
    timeout = view.deadlines.docker.seconds
    o = observe_node(a, view, full=True, probes=world.probes)
    reading = NodeReading(name, t.role, t.target, error=o.error, host=o.host, interfaces=o.interfaces, gpu=o.gpu,
                          memory=o.memory, docker_version=o.docker_version, containers=o.containers,
                          listening=o.listening, errors=o.probe_errors)
    if o.error:
        return reading
    errors = list(o.probe_errors)
    runtimes: tuple[str, ...] = ()
    default, cdi = "", runtimes
    try:
        runtimes, default, cdi = guarded("docker info", _engine, a, timeout)
    except AdapterError as e:
        errors.append(f"docker info: {e}")
    pids: dict[str, tuple[int, ...]] = {}
    for c in o.containers:
        if c.running:
            try:
                pids[c.name] = tuple(guarded("container processes", a.docker.pids, c.name))
            except AdapterError as e:
                errors.append(f"processes of {c.name}: {e}")
    units = None
    try:
        r = guarded("units", a.shell.run, commands.systemctl_show([*SERVER_UNIT_PATTERNS, *OOM_UNITS,
                                                                    *view.cfg.stale.units]))
        units = guarded("units", _units, r)
    except AdapterError as e:
        errors.append(f"systemctl: {e}")
    images: list[ImageSeen] = []
    try:
        images = [ImageSeen(tag, iid, created) for tag, iid, created in
                  guarded("images", _images, a, view.dep.ray.image, timeout)]
    except AdapterError as e:
        errors.append(f"images: {e}")
    models: list[ModelSeen] = []
    try:
        models = [ModelSeen(m, where, src) for m, where, src in guarded("models", _model_places, a, models_dir)]
    except AdapterError as e:
        errors.append(f"models: {e}")
    return replace(reading, runtimes=runtimes, default_runtime=default, cdi_dirs=cdi, container_pids=pids,
                   units=units, images=tuple(images), models=tuple(models), errors=tuple(errors))


def _checked(base: Mapping[str, object], targets: list[Target], state_dir: str, image: str, model: str,
             action: type[CheckImage] | type[CheckModel], models_dir: str = "") -> dict[str, ImageReport | ModelReport | str]:
    """One check (the image's, or the model's in ``image``) on every node, as the daemon runs it, dry."""
    cfg = probe_config(base, targets, state_dir, image=image, model=model, models_dir=models_dir)
    world = World(DeploymentView.build(cfg, cfg.deployments[0]))
    actor = Actor(world, structlog.get_logger(), dry=True)

    def one(name: str) -> ImageReport | ModelReport | str:
        try:
            got = actor.run(action(name))
        except ActionFailed as e:
            return str(e.why)
        except AdapterError as e:
            return str(e)
        return got if isinstance(got, ImageReport | ModelReport) else f"{action.__name__} gave no report"
    try:
        with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="discover") as pool:
            return dict(zip([t.name for t in targets], pool.map(one, [t.name for t in targets]), strict=True))
    finally:
        world.close()


def read_nodes(base: Mapping[str, object], targets: list[Target], models_dir: str = "") -> list[NodeReading]:
    """Every node read, in parallel; then the image check of each vLLM-looking image, and the model check of
    each model found (in the best image that holds vLLM on every node, else the base's image)."""
    state_dir = tempfile.mkdtemp(prefix="spark-discover-")
    try:
        cfg = probe_config(base, targets, state_dir)
        world = World(DeploymentView.build(cfg, cfg.deployments[0]))
        try:
            with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="discover") as pool:
                readings = list(pool.map(lambda t: _read_node(world, t.name, t, models_dir), targets))
        finally:
            world.close()
        tags = sorted({i.tag for r in readings for i in r.images if all(any(j.tag == i.tag for j in x.images)
                                                                        for x in readings)})
        for tag in tags:
            got = _checked(base, targets, state_dir, tag, "", CheckImage)
            readings = [replace(r, images=tuple(replace(i, report=x if isinstance(x := got.get(r.name), ImageReport)
                                                        else None, error="" if isinstance(x, ImageReport) else str(x))
                                                if i.tag == tag else i for i in r.images)) for r in readings]
        with_vllm = [t for t in tags if all(any(i.tag == t and i.report and i.report.vllm_path for i in r.images)
                                            for r in readings)]
        image = with_vllm[0] if with_vllm else str(cfg.deployments[0].ray.image)
        for model in sorted({m.model for r in readings for m in r.models}):
            got = _checked(base, targets, state_dir, image, model, CheckModel, models_dir)
            readings = [replace(r, models=tuple(replace(m, report=x if isinstance(x := got.get(r.name), ModelReport)
                                                        else None, error="" if isinstance(x, ModelReport) else str(x))
                                                if m.model == model else m for m in r.models)) for r in readings]
        return readings
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
