"""Carry out planned actions through the adapters; adapter errors become reasons (ActionFailed)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from . import commands
from .adapters import AdapterError
from .config import serve_hash
from .model import Action, RemoveContainers, StartRay, StartServe, StopServe, StopUnits, Verdict, Verify
from .observe import World


class ActionFailed(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _transient(e: BaseException) -> bool:
    return isinstance(e, AdapterError) and e.reason in ("DockerUnreachable", "CommandTimeout")


# One quick retry of a single operation on a transient engine/SSH hiccup; recovering a phase is the
# loop's job, so this never waits long.
_retry = retry(retry=retry_if_exception(_transient), stop=stop_after_attempt(2),
               wait=wait_random_exponential(multiplier=0.2, max=1), reraise=True)


class Actor:
    def __init__(self, world: World, log: Any):
        self.world, self.log = world, log

    def run(self, action: Action) -> Verdict | None:
        try:
            return self._dispatch(action)
        except AdapterError as e:
            raise ActionFailed(str(e)) from None

    def _dispatch(self, action: Action) -> Verdict | None:
        w, cfg = self.world, self.world.cfg
        dep = cfg.deployment
        match action:
            case StopUnits(node=node, units=units, disable=disable, mask=mask):
                a = w.nodes[node]
                for unit in units:  # in the configured order
                    self._systemctl(a, "stop", unit)
                    self.log.info("clean.unit_stopped", node=node, unit=unit)
                    if mask or disable:
                        verb, done = ("mask", "masked") if mask else ("disable", "disabled")
                        self._systemctl(a, verb, unit)
                        self.log.info(f"clean.unit_{done}", node=node, unit=unit)
            case RemoveContainers(node=node, containers=names, why=why):
                with ThreadPoolExecutor(max_workers=len(names)) as pool:  # `docker rm -f` waits for each stop
                    removed = list(pool.map(_retry(w.nodes[node].docker.remove), names))
                for name, existed in zip(names, removed, strict=True):
                    if existed:
                        self.log.info("clean.container_removed", node=node, container=name, why=why)
            case StartRay(node=node):
                a = w.nodes[node]
                spec = commands.ray_container(cfg, dep, a.node)
                self._ensure_image(a, spec.image)
                cid = _retry(a.docker.run)(spec)
                self.log.info("ray.container_started", node=node, container=spec.name, id=cid,
                              role=a.node.role, node_ip=a.node.fabric_ip)
            case StartServe():
                head = w.head()
                container = commands.ray_container_name(dep, cfg.head)
                argv = commands.serve_launch(cfg, dep, serve_hash(cfg, dep))
                head.docker.exec(container, argv, env=commands.serve_env(cfg, dep), detach=True)
                self.log.info("serve.launched", container=container, argv=commands.serve_argv(dep),
                              log=f"{commands.serve_dir(dep)}/log")
            case StopServe(why=why):
                container = commands.ray_container_name(dep, cfg.head)
                w.head().docker.exec(container, commands.serve_stop(dep))
                self.log.info("serve.stopped", container=container, why=why)
            case Verify(serve=serve, deep=deep):
                r = dep.readiness
                timeout = cfg.healing.deep_probe_timeout if deep else r.request_timeout
                v = w.api.sanity(dep.serve.name, r.sanity_prompt, r.sanity_max_tokens, timeout, serve)
                event = f"probe.{'deep' if deep else 'sanity'}_{'passed' if v.passed else 'failed'}"
                (self.log.info if v.passed else self.log.warning)(
                    event, why=v.why, finish_reason=v.finish_reason, field=v.field, latency_s=v.latency_s, ran=v.ran)
                return v
        return None

    def _systemctl(self, a: Any, verb: str, unit: str) -> None:
        r = a.shell.run(commands.systemctl(verb, [unit]))
        if r.rc != 0:
            raise ActionFailed(f"SystemctlFailed: systemctl {verb} {unit} on {a.node.name}: "
                               f"{(r.err.strip() or f'exit {r.rc}')[-200:]}")

    def _ensure_image(self, a: Any, image: str) -> None:
        if a.docker.has_image(image):
            return
        policy = self.world.cfg.deployment.ray.image_pull
        if policy == "never":
            raise ActionFailed(f"ImageMissing: {image} is not on {a.node.name} and image_pull = \"never\" "
                               f"(load it with `docker load` or set image_pull = \"if-missing\")")
        self.log.warning("image.pulling", node=a.node.name, image=image)
        a.docker.pull(image)
