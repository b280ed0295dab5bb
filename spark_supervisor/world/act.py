"""Carry out planned actions through the adapters; adapter errors become reasons (ActionFailed)."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tenacity

from ..adapters import AdapterError, NotFoundError
from ..adapters import retry as retry_mod
from ..base import redaction
from ..base.log import Log
from ..config import Deployment, Node, identity
from ..judge import access, completion, modelcheck
from ..judge.preflight import parse_image_probe
from ..model import (
    Action,
    CheckImage,
    CheckModel,
    Container,
    ContainerSpec,
    DropPageCache,
    ImageReport,
    Kind,
    Measure,
    ModelReport,
    Outcome,
    PrefetchModel,
    Reason,
    RemoveContainers,
    ServeObservation,
    StartContainer,
    StartServe,
    StopServe,
    StopUnits,
    Verdict,
    Verify,
)
from ..model.reason import deterministic as reason_deterministic
from ..specs import commands, modelprobe, requests
from ..state import modelchecks, statefile
from . import perf
from .observe import NodeAdapters, World, parse_serve_state


class ActionFailed(Exception):
    """An action could not be carried out. ``deterministic``: it would fail the same way on retry
    (a missing image with pulls disabled): FAILED with the reason instead of burning retries. Its kind
    says so (Kind.deterministic) unless the case decides (``deterministic`` given)."""

    def __init__(self, kind: str, detail: str, *, deterministic: bool | None = None):
        self.why = Reason(kind, detail)
        super().__init__(str(self.why))
        self.reason = str(self.why)
        self.deterministic = reason_deterministic(kind) if deterministic is None else deterministic


class Actor:
    # Told, from a pull's heartbeat, that bytes of an image pull arrived: the loop counts them as start progress
    # (systemd's start timeout). Set by the loop; None elsewhere.
    pull_moved: Callable[[], None] | None = None

    def __init__(self, world: World, log: Log, heartbeat: Callable[[], None] | None = None, *, dry: bool = False):
        """dry: `apply --dry-run --prove`'s actor: its checks run in probe containers of what is already on the
        nodes, and it changes nothing else anywhere -- no pull, no prefetch, no removal of a container it did not
        start, no state file. What a reload would pull or fetch is said in ``would`` instead."""
        self.world, self.log, self.heartbeat = world, log, heartbeat
        self.dry = dry
        self.would: list[str] = []
        # A transient engine/SSH hiccup is retried within one operation, as the config's [retry] says.
        self._retry = retry_mod.from_config(world.cfg.retry)
        self.models = modelchecks.Kept(world.cfg.supervisor.state_dir)
        self.pins: dict[str, str] = {}  # node -> image ID its repairs start (Status.pinned)

    def run(self, action: Action) -> Outcome:
        try:
            return self._dispatch(action)
        except AdapterError as e:
            # An adapter's error (an engine's or SSH's answer) is retried, whatever its kind is called.
            raise ActionFailed(e.reason, str(e.args[0]), deterministic=False) from None

    def _dispatch(self, action: Action) -> Outcome:
        w, cfg = self.world, self.world.cfg
        view, dep = w.view, w.view.dep
        match action:
            case StopUnits(node=node, units=units, disable=disable, mask=mask):
                self._stop_units(w.nodes[node], units, disable, mask)
            case RemoveContainers(node=node, containers=names, why=why):
                with ThreadPoolExecutor(max_workers=len(names)) as pool:  # `docker rm -f` waits for each stop
                    removed = list(pool.map(self._retry(w.nodes[node].docker.remove), names))
                for name, existed in zip(names, removed, strict=True):
                    if existed:
                        self.log.info("clean.container_removed", node=node, container=name, why=why)
            case CheckImage(node=node, model_later=later):
                return self._check(w.nodes[node], later)
            case CheckModel(node=node):
                return self._check_model(w.nodes[node])
            case PrefetchModel(node=node):
                return self._prefetch_model(w.nodes[node])
            case StartContainer(node=node, dashboard=dashboard):
                a = w.nodes[node]
                spec = self._pinned(node, commands.node_container(cfg, dep, a.node, dashboard=dashboard))
                ensure_image(self, a, spec.image)
                cid = self._retry(a.docker.run)(spec)
                self.log.info("ray.container_started", node=node, container=spec.name, id=cid,
                              role=a.node.role, node_ip=a.node.fabric_ip)
            case StartServe():
                sh = view.serve_hash
                for rank in view.serve_nodes:  # rank 0 first: the others connect to it
                    container = identity.node_container_name(dep, rank)
                    w.nodes[rank.name].docker.exec(container, commands.serve_launch(cfg, dep, sh, rank),
                                                   env=commands.serve_env(cfg, dep, sh, rank), detach=True)
                    recorded(w, rank.name, container, self.log)
                    self.log.info("serve.launched", node=rank.name, container=container,
                                  argv=commands.shown_argv(cfg, dep, commands.serve_argv(dep, commands.rank_args(cfg, dep, rank))),
                                  log=f"{commands.serve_log_dir(dep, rank) or commands.serve_dir(dep)}/"
                                      + ("current" if dep.serve.log_host_dir else "log"))
            case DropPageCache(node=node, why=why):
                self._drop_page_cache(w.nodes[node], dep.ray.image)
                self.log.info("memory.page_cache_dropped", node=node, why=why)
            case StopServe(why=why):
                nodes = list(view.serve_nodes)
                with ThreadPoolExecutor(max_workers=len(nodes)) as pool:  # every rank: one does not outlive the rest
                    list(pool.map(self._stop_serve, nodes))
                self.log.info("serve.stopped", nodes=[n.name for n in nodes], why=why)
            case Measure(serve=serve):
                return perf.measure(w.api, dep, serve, self.log, cfg.healing.deep_probe_timeout)
            case Verify(serve=serve, deep=deep, timeout=timeout):
                return verify(self.world, self.log, serve, deep, timeout)
        return None

    def _stop_units(self, a: NodeAdapters, units: tuple[str, ...], disable: bool, mask: bool) -> None:
        for unit in units:  # in the configured order
            systemctl(a, "stop", unit)
            self.log.info("clean.unit_stopped", node=a.node.name, unit=unit)
            if mask or disable:
                verb, done = ("mask", "masked") if mask else ("disable", "disabled")
                systemctl(a, verb, unit)
                self.log.info(f"clean.unit_{done}", node=a.node.name, unit=unit)

    def _pinned(self, node: str, spec: ContainerSpec) -> ContainerSpec:
        """The spec with the image its node ran when the deployment last served, by ID, if one is pinned: the
        node container and every helper of the image (its checks, the prefetch) run what served."""
        pin = self.pins.get(node)
        return dataclasses.replace(spec, image=pin) if pin else spec

    def _redact(self, out: str) -> str:
        """A helper's output (the image could echo its environment) fit for a reason or a log line."""
        return redaction.text(out, self.world.view.secrets)

    def _check(self, a: NodeAdapters, model_later: bool) -> ImageReport:
        """The image check, and the model check with it unless it may wait for the Ray join (``model_later``
        and the model complete at the node's last check)."""
        dep = self.world.view.dep
        model_due = dep.model.check and not (model_later and self.models.complete(a.node.name,
                                                                                   modelprobe.key(self.world.cfg, dep)))
        report = self._check_image(a, with_model=model_due)
        if not dep.model.check:
            return report
        if not model_due:
            return dataclasses.replace(report, model_later=True)
        return report if report.model is not None else dataclasses.replace(report, model=self._check_model(a))

    def _check_image(self, a: NodeAdapters, *, with_model: bool = False) -> ImageReport:
        """commands.IMAGE_PROBE in a short-lived container of the image on the node; a check already made
        of this very image (its ID) for this spec is not made again (a reboot does not change the image).
        with_model: the model check made in the same container (the report's model) when the image is checked
        afresh and no prefetch is there: a first start, or a new image, saves a container's start."""
        cfg = self.world.cfg
        dep, node = self.world.view.dep, a.node.name
        spec = self._pinned(node, commands.image_probe(cfg, dep, a.node))
        ensure_image(self, a, spec.image)
        (image_id, digests), key = a.docker.image_ref(spec.image), self.world.view.image_key
        state_dir = cfg.supervisor.state_dir
        kept = statefile.read_node(state_dir, node)
        if kept.get("image_id") == image_id and kept.get("key") == key:
            report = kept_report(kept.get("report"), image_id, digests)
            if report is not None:
                summary = report.summary(dep.uses_ray)
                self.log.info("image.checked", node=node, image=spec.image, kept=True, summary=summary)
                return report
        both = with_model and prefetch_container(a, dep) is None
        if both:
            code, out = a.docker.run_once(self._pinned(node, commands.checks_probe(cfg, dep, a.node)),
                                          timeout=self.world.view.deadlines.checks.seconds)
        else:
            code, out = a.docker.run_once(spec)
        image_code, image_out, model_out = commands.split_checks(code, out) if both else (code, out, "")
        if image_code != 0:  # the probe itself always exits 0: the image could not even run sh
            raise ActionFailed(Kind.IMAGE_CHECK_FAILED, f"{node}: {spec.image} exited {image_code}: "
                               f"{self._redact(image_out.strip()[-200:])}",
                               deterministic=image_code in (126, 127))  # the image cannot run sh: the case decides
        report = dataclasses.replace(parse_image_probe(node, spec.image, key, image_out), image_id=image_id,
                                     repo_digests=digests)
        self.log.info("image.checked", node=node, image=spec.image, ray=report.ray_version or None,
                      ray_present=bool(report.ray_path), dashboard=report.dashboard,
                      vllm=report.vllm_version or None, vllm_present=bool(report.vllm_path),
                      python=report.ray_python or report.vllm_python, summary=report.summary(dep.uses_ray))
        try:
            if not self.dry:
                statefile.update_node(state_dir, node, image_id=image_id, key=key, report=dataclasses.asdict(report))
        except OSError as e:  # only a saving lost: the next start checks again
            self.log.warning("state.write_failed", file=statefile.NODES, error=str(e))
        return dataclasses.replace(report, model=self._model_checked(a, spec.image, code, model_out)) if both else report

    def _check_model(self, a: NodeAdapters) -> ModelReport:
        """modelprobe.PROBE_PY in a short-lived container of the image on the node, every time (files come
        and go). While a prefetch runs there, its progress instead; once it has ended, its container goes and
        the node is checked again."""
        cfg = self.world.cfg
        dep, node = self.world.view.dep, a.node
        found = prefetch_container(a, dep)
        detail = ""
        if found is not None:
            p: dict[str, Any] = {}
            if found.running:
                code, out = a.docker.exec(found.name, ["cat", modelprobe.PROGRESS], what="prefetch progress")
                p = modelcheck.parse_progress(out) if code == 0 else {}
                if p.get("state", "running") == "running":
                    n = {k: int(p.get(k) or 0) for k in ("files_done", "files_total", "bytes_done", "bytes_total")}
                    return ModelReport(node.name, dep.serve.model, modelprobe.key(cfg, dep), path=str(p.get("target", "")),
                                       prefetch="running", prefetched=True, files_done=n["files_done"],
                                       files_total=n["files_total"], bytes_done=n["bytes_done"],
                                       bytes_total=n["bytes_total"])
            detail = self._redact(p.get("error") or f"{p.get('files_done', 0)} files, {int(p.get('bytes_done') or 0):,} bytes "
                      f"from {p.get('source')}" if p else f"its container {found.state} without a result")
            (self.log.warning if p.get("error") or not p else self.log.info)(
                "model.prefetch_ended", node=node.name, state=p.get("state"), detail=detail)
            if not self.dry:  # the daemon's to remove, once it has read it
                a.docker.remove(found.name)
        spec = self._pinned(node.name, commands.model_probe(cfg, dep, node))
        code, out = a.docker.run_once(spec)
        return self._model_checked(a, spec.image, code, out, prefetched=found is not None, detail=detail)

    def _model_checked(self, a: NodeAdapters, image: str, code: int, out: str, *, prefetched: bool = False,
                       detail: str = "") -> ModelReport:
        """The model probe's answer judged, kept for the next start's CheckImage(model_later=True), and logged."""
        cfg = self.world.cfg
        dep, node = self.world.view.dep, a.node
        key = modelprobe.key(cfg, dep)
        if code != 0:  # the probe exits 0 whatever it finds: the image could not run it (unknown, not missing)
            raise ActionFailed(Kind.MODEL_CHECK_FAILED, f"{node.name}: {image} exited {code}: {self._redact(out.strip()[-200:])}")
        try:
            report = modelcheck.judge(node.name, dep.serve.model, key, modelcheck.parse(out))
        except modelcheck.ProbeError as e:
            raise ActionFailed(Kind.MODEL_CHECK_FAILED, f"{node.name}: {e}") from None
        report = dataclasses.replace(report, prefetched=prefetched, detail=detail)
        try:
            if not self.dry:
                self.models.note(node.name, key, not report.missing and not report.unchecked)
        except OSError as e:  # only a saving lost: a restarted daemon checks before it starts
            self.log.warning("state.write_failed", file=statefile.NODES, error=str(e))
        (self.log.warning if report.missing or report.unchecked else self.log.info)(
            "model.checked", node=node.name, model=dep.serve.model, path=report.path, complete=not report.missing,
            missing=list(report.missing[:10]), missing_count=len(report.missing), files=report.files,
            bytes=report.bytes, unchecked=report.unchecked or None, summary=report.summary())
        return report

    def _prefetch_model(self, a: NodeAdapters) -> ImageReport:
        """Start the prefetch on a node (a detached container: its progress is read at each tick)."""
        cfg, dep = self.world.cfg, self.world.view.dep
        if self.dry:
            raise ActionFailed(Kind.CHANGE_REFUSED, "a dry run starts no prefetch", deterministic=True)
        spec = self._pinned(a.node.name, commands.model_prefetch(cfg, dep, a.node))
        a.docker.remove(spec.name)  # one left from an earlier run
        ensure_image(self, a, spec.image)
        cid = a.docker.run(spec)
        self.log.warning("model.prefetch_started", node=a.node.name, model=dep.serve.model, container=spec.name, id=cid,
                         source=dep.model.prefetch_from or "hub", timeout_s=dep.model.prefetch_timeout)
        return dataclasses.replace(self._check_image(a), model=ModelReport(
            a.node.name, dep.serve.model, modelprobe.key(cfg, dep), prefetch="running", prefetched=True))

    def _stop_serve(self, node: Node) -> None:
        dep = self.world.view.dep
        try:
            self.world.nodes[node.name].docker.exec(identity.node_container_name(dep, node), commands.serve_stop(dep),
                                                    what="serve stop")
        except NotFoundError:
            pass  # its container is gone, and the serve with it

    def _drop_page_cache(self, a: NodeAdapters, image: str) -> None:
        """sync; echo 3 > /proc/sys/vm/drop_caches on the node. The node's own command when configured;
        a worker over SSH; the head in a short-lived container through its Docker engine (cap SYS_ADMIN,
        /proc/sys/vm bound in), so the unit itself keeps ProtectKernelTunables and no capability."""
        if a.node.drop_caches or a.node.remote:
            # The node's own command as given; the built-in one behind the node's privilege prefix (become).
            for argv in [list(a.node.drop_caches)] if a.node.drop_caches else commands.drop_caches(a.node.become):
                r = a.shell.run(argv)
                if r.rc != 0 and access.denied(r.err) and not a.node.drop_caches:
                    raise ActionFailed(Kind.NO_PRIVILEGE, f"{a.node.name}: {shlex.join(argv)}: "
                                       f"{r.err.strip()[-200:]}: {access.PRIVILEGE_HINT}")
                if r.rc != 0:  # not allowed or not there: the same again on retry
                    raise ActionFailed(Kind.PAGE_CACHE_DROP_FAILED, f"{a.node.name}: {argv[0]}: "
                                       f"{(r.err.strip() or f'exit {r.rc}')[-200:]} (set nodes.become, nodes.drop_caches "
                                       "or [memory] page_cache = \"never\": docs/privileges.md)")
            return
        ensure_image(self, a, image)
        code, out = a.docker.run_once(commands.drop_caches_container(image))
        if code != 0:  # the image cannot do it (no sh, no sync, no write): the same again on retry
            raise ActionFailed(Kind.PAGE_CACHE_DROP_FAILED, f"{a.node.name}: helper container exited {code}: {self._redact(out[-200:])} "
                               "(set nodes.drop_caches, or [memory] page_cache = \"never\")")


def ensure_image(actor: Actor, a: NodeAdapters, image: str) -> None:
    """The image on the node: there, pulled as the config allows, or why not (a dry run says it would pull)."""
    if a.docker.has_image(image):
        return
    if image in actor.pins.values():  # the image that served, by ID: pruned; no name to pull it by
        tag = actor.world.view.dep.ray.image
        raise ActionFailed(Kind.PINNED_IMAGE_GONE, f"pinned image {image[:19]} is gone on {a.node.name} (pruned?): "
                           f"`spark-supervisor reset` (or a reload) starts what {tag} names now", deterministic=True)
    policy = actor.world.view.dep.ray.image_pull
    if actor.dry and policy != "never":
        actor.would.append(f"pull {image} on {a.node.name} (size unknown)")
        raise ActionFailed(Kind.IMAGE_MISSING, f"{image} is not on {a.node.name} yet: not proven here (a reload "
                           "pulls it first, then proves it)", deterministic=True)
    if policy == "never":
        raise ActionFailed(Kind.IMAGE_MISSING, f"{image} is not on {a.node.name} and image_pull = \"never\" "
                           "(build it from etc/vllm-ray.Dockerfile on one node, then `docker save "
                           f"{image} | ssh <node> docker load`; or set image_pull = \"if-missing\")")
    room_to_pull(actor.world.cfg.deployment.ray.pull_min_free_gib, a, image, actor.log)
    timeout = actor.world.view.dep.ray.pull_timeout
    actor.log.warning("image.pulling", node=a.node.name, image=image, timeout_s=timeout)
    last = [0.0]
    # The sizes last seen, and whether they changed since the last beat: set in the pull's own thread, read
    # in the beat. Only a change is progress: a stalled pull must not keep the start alive.
    seen: list[tuple[int, int] | None] = [None]
    moved = [False]

    def progress(done: int, total: int) -> None:
        if seen[0] != (done, total):
            seen[0], moved[0] = (done, total), True
        now = time.monotonic()
        if now - last[0] >= 10:
            last[0] = now
            actor.log.info("image.pull_progress", node=a.node.name, image=image,
                          done_mib=done >> 20, total_mib=total >> 20)

    def beat() -> None:
        """About once a second while the pull runs: the watchdog fed, and bytes that arrived told as progress."""
        if actor.heartbeat is not None:
            actor.heartbeat()
        if moved[0] and actor.pull_moved is not None:
            moved[0] = False
            actor.pull_moved()
    a.docker.pull(image, timeout=timeout, heartbeat=beat, progress=progress)
    actor.log.info("image.pulled", node=a.node.name, image=image)


def prefetch_container(a: NodeAdapters, dep: Deployment) -> Container | None:
    """The node's prefetch container, if there is one."""
    return identity.named(a.docker.containers(), identity.prefetch_name(dep, a.node))


def systemctl(a: NodeAdapters, verb: str, unit: str) -> None:
    """A stale unit stopped, disabled or masked on the node, behind its privilege prefix ([[nodes]] become)."""
    r = a.shell.run(commands.systemctl(verb, [unit], a.node.become))
    if r.rc != 0:
        said = f"systemctl {verb} {unit} on {a.node.name}: {(r.err.strip() or f'exit {r.rc}')[-200:]}"
        if access.denied(r.err):
            raise ActionFailed(Kind.NO_PRIVILEGE, f"{said}: {access.PRIVILEGE_HINT}")
        raise ActionFailed(Kind.SYSTEMCTL_FAILED, said)


def kept_report(kept: object, image_id: str, digests: tuple[str, ...] | None = None) -> ImageReport | None:
    """An image check kept in images.json, with the ID (and digests: None, those kept) inspected now; None for
    one of another shape (an earlier version's, without what the check reads now; a damaged file): the image
    is checked again."""
    if not isinstance(kept, dict):
        return None
    try:
        if {f.name for f in dataclasses.fields(ImageReport)} - set(kept):
            return None
        report = ImageReport(**kept)
        if not isinstance(report.repo_digests, list | tuple):
            raise TypeError("repo_digests")
        digests = tuple(map(str, report.repo_digests)) if digests is None else digests
        # the model is checked on every start, never kept with the image
        report = dataclasses.replace(report, image_id=image_id, repo_digests=digests, model=None)
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    if not all(isinstance(getattr(report, f.name), type(f.default)) for f in dataclasses.fields(report)
               if isinstance(f.default, str | int)):
        return None  # a field of another type
    return report


def room_to_pull(need: float, a: NodeAdapters, image: str, log: Log) -> None:
    """A pull only where the engine's disk has ray.pull_min_free_gib (``need``) free; a free space that cannot
    be read is no evidence either way (the pull goes on, and fails by itself if the disk fills)."""
    if not need:
        return
    try:
        root = a.docker.root_dir()
        free = free_gib(a.shell.run(["df", "-Pk", root]).out) if root else None
    except AdapterError as e:
        root, free = "", None
        log.warning("image.disk_unread", node=a.node.name, error=str(e))
    if free is not None and free < need:
        raise ActionFailed(Kind.DISK_TOO_FULL, f"{image} not pulled on {a.node.name}: {free:.1f} GiB free in "
                           f"{root}, under ray.pull_min_free_gib = {need:g} (free space, or lower it)",
                           deterministic=True)


def free_gib(df: str) -> float | None:
    """GiB available from `df -Pk DIR`'s data line (POSIX format: the fourth field, in KiB); None unreadable."""
    rows = [ln.split() for ln in df.strip().splitlines()[1:]]
    try:
        return int(rows[-1][3]) / (1 << 20)
    except (IndexError, ValueError):
        return None


def verify(w: World, log: Log, serve: str, deep: bool, timeout: float) -> Verdict:
    """One real request of the readiness probe's kind (readiness, or with deep the liveness probe)."""
    cfg = w.cfg
    dep = w.view.dep
    r = dep.readiness
    timeout = timeout or (cfg.healing.deep_probe_timeout if deep else r.request_timeout)
    # The engine's own counters over the probe's window: a probe that waited behind others' work is busy,
    # not failed (completion.beside_heartbeat). Read only with the heartbeat followed.
    before = w.api.engine() if cfg.healing.heartbeat_stall else None
    path, body = requests.sanity_request(r.probe, dep.serve.name, r.sanity_prompt, r.sanity_max_tokens)
    v = completion.judged(r.probe, w.api.sanity(path, body, timeout, serve), serve)
    if before is not None and v.timed_out:
        v = completion.beside_heartbeat(v, before, w.api.engine(), deep=deep)
    outcome = "passed" if v.passed else "busy" if v.busy else "failed"
    (log.info if v.passed or v.busy else log.warning)(
        f"probe.{'deep' if deep else 'sanity'}_{outcome}", why=v.why, finish_reason=v.finish_reason,
        field=v.field, latency_s=v.latency_s, ran=v.ran)
    return v


LAUNCH_RECORD_S = 10.0  # the most a launch waits for its wrapper to record the serve it started


def recorded(w: World, node: str, container: str, log: Log) -> None:
    """Wait until the wrapper just launched (detached) has recorded its serve, running or ended: from then on
    every reading of the serve's state speaks of this instance, and a tick between the launch and the record
    cannot take it for no serve (and launch a second) nor for one ended. Bounded; past it the ticks judge."""
    dep = w.view.dep

    def state() -> ServeObservation | None:
        try:
            code, out = w.nodes[node].docker.exec(container, commands.serve_state(dep, 0), what="serve state")
            return parse_serve_state(out) if code == 0 else None
        except (AdapterError, ValueError):
            return None

    def unrecorded(s: ServeObservation | None) -> bool:
        return s is None or not s.present or (not s.running and s.exit_code is None)

    try:
        tenacity.Retrying(retry=tenacity.retry_if_result(unrecorded), stop=tenacity.stop_after_delay(LAUNCH_RECORD_S),
                          wait=tenacity.wait_exponential(multiplier=0.02, max=0.5))(state)
    except tenacity.RetryError:
        log.warning("serve.launch_unrecorded", node=node, container=container, within_s=LAUNCH_RECORD_S)
