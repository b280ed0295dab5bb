"""A change is proven before it replaces what serves (issue 22, item 1): a reload that changes a serving
deployment's spec keeps the old one serving until the new spec is proven on every member (Backend.prove);
a refused proof keeps the previous config whole and says why (status, alert, metric); a proven one is
applied. The proofs run inline here (tests.fakes.prove_inline): the fake clock and ticks decide."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import tomli_w

from spark_supervisor.model import Phase, Reason, RemoveContainers
from tests.fakes import FakeBackend
from tests.helpers import with_image
from tests.unit.test_stack import EMBED, make, serving, stack, ticks_until

NEW_IMAGE = "spark/vllm:0.34-typo"


def running(tmp_path: Path) -> tuple[Any, dict[str, FakeBackend], Any, Path, dict[str, Any]]:
    """Both deployments SERVING; a backend made from here on (a switched-to spec's) sees nothing of its own
    deployed yet: the old containers gone, its start under way."""
    from tests.helpers import obs
    d = stack({**EMBED, "after": []})
    daemon, be, clock, _, path = make(tmp_path, d)
    serving(daemon, be, "qwen")
    serving(daemon, be, "embed")
    ticks_until(daemon, lambda: daemon.status_line() == "SERVING 2/2 deployments")
    factory = daemon.stack.backend_factory

    def starting(view: Any) -> FakeBackend:
        b = factory(view)
        assert isinstance(b, FakeBackend)
        b.next = obs(view.cfg)
        return b
    daemon.stack.backend_factory = starting
    return daemon, be, clock, path, d


def recording(daemon: Any) -> list[FakeBackend]:
    """Every backend the stack makes from here on (a proof's among them)."""
    made: list[FakeBackend] = []
    factory = daemon.stack.backend_factory

    def record(view: Any) -> FakeBackend:
        b = factory(view)
        assert isinstance(b, FakeBackend)
        made.append(b)
        return b
    daemon.stack.backend_factory = record
    return made


def reload_to(daemon: Any, clock: Any, path: Path, d: dict[str, Any]) -> None:
    """The operator's edit and SIGHUP, read the same again after the settle time, then the proof's verdict."""
    path.write_text(tomli_w.dumps(with_image(d)))
    daemon.reload()
    clock.t += daemon.SETTLE_S
    daemon.tick()  # settled: the proof starts (inline here: its verdict is in)
    daemon.tick()  # the verdict acted on


def test_a_change_whose_proof_fails_stops_nothing_and_says_why(tmp_path: Path) -> None:
    daemon, be, clock, path, d = running(tmp_path)
    old_cfg, qwen, old_backend = daemon.cfg, daemon.reconcilers["qwen"], be["qwen"]
    for b in be.values():
        b.ran.clear()
    d2 = copy.deepcopy(d)
    d2["deployments"][0].setdefault("ray", {})["image"] = NEW_IMAGE

    made: list[FakeBackend] = []
    factory = daemon.stack.backend_factory

    def refusing(view: Any) -> FakeBackend:
        b = factory(view)
        assert isinstance(b, FakeBackend)
        b.refusal = Reason("ChangeRefused", f"ImageMissing: {NEW_IMAGE} is not on spark-2")
        made.append(b)
        return b
    daemon.stack.backend_factory = refusing
    reload_to(daemon, clock, path, d2)
    assert made and made[0].proofs == 1 and made[0].closed  # proven on a backend of its own, closed after
    assert daemon.cfg is old_cfg and daemon.reconcilers["qwen"] is qwen and qwen.backend is old_backend
    assert qwen.status.phase == Phase.SERVING and not old_backend.ran  # nothing stopped
    assert not any(isinstance(a, RemoveContainers) for b in be.values() for a in b.ran)
    assert daemon.reloader.refused == {"qwen": Reason("ChangeRefused", f"ImageMissing: {NEW_IMAGE} is not on spark-2")}
    assert f"reload failed: ChangeRefused: qwen: ImageMissing: {NEW_IMAGE} is not on spark-2" in daemon.status_line()
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert doc["reload"]["refused"] == [f"ChangeRefused: qwen: ImageMissing: {NEW_IMAGE} is not on spark-2"]
    # Still refused a sweep later: the refusal is not tried again by the loop on its own.
    clock.t += 10
    daemon.tick()
    assert daemon.cfg is old_cfg and made[0].proofs == 1 and len(made) == 1
    # A SIGHUP with the same file proves afresh (the operator may have loaded the image since).
    daemon.stack.backend_factory = factory
    daemon.reload()
    daemon.tick()
    assert daemon.cfg is not old_cfg and daemon.reconcilers["qwen"].view.dep.ray.image == NEW_IMAGE
    assert daemon.reloader.refused == {} and "reload failed" not in daemon.status_line()


def test_a_change_that_is_proven_is_applied_and_the_other_deployment_untouched(tmp_path: Path) -> None:
    daemon, be, clock, path, d = running(tmp_path)
    embed, embed_backend = daemon.reconcilers["embed"], be["embed"]
    d2 = copy.deepcopy(d)
    d2["deployments"][0].setdefault("ray", {})["image"] = NEW_IMAGE
    path.write_text(tomli_w.dumps(with_image(d2)))
    daemon.reload()
    clock.t += daemon.SETTLE_S
    daemon.tick()
    assert daemon.reconcilers["qwen"].view.dep.ray.image != NEW_IMAGE  # proving: the old one serves on
    assert "reload proving: replaces 'qwen'" in daemon.status_line()
    daemon.tick()
    assert daemon.reconcilers["qwen"].view.dep.ray.image == NEW_IMAGE
    assert daemon.reconcilers["embed"] is embed and embed.backend is embed_backend


def test_a_change_of_a_deployment_that_does_not_serve_needs_no_proof(tmp_path: Path) -> None:
    d = stack({**EMBED, "after": []})
    daemon, be, clock, _, path = make(tmp_path, d)  # nothing runs yet
    made = recording(daemon)
    d2 = copy.deepcopy(d)
    d2["deployments"][0].setdefault("ray", {})["image"] = NEW_IMAGE
    path.write_text(tomli_w.dumps(with_image(d2)))
    daemon.reload()
    clock.t += daemon.SETTLE_S
    daemon.reload()
    assert daemon.reconcilers["qwen"].view.dep.ray.image == NEW_IMAGE
    assert not any(b.proofs for b in made)


def test_a_settings_only_change_applies_in_place_without_a_proof(tmp_path: Path) -> None:
    daemon, be, clock, path, d = running(tmp_path)
    made = recording(daemon)
    d2 = copy.deepcopy(d)
    d2["healing"] = {**d2.get("healing", {}), "deep_probe_interval": 120}
    path.write_text(tomli_w.dumps(with_image(d2)))
    daemon.reload()
    assert daemon.cfg.healing.deep_probe_interval == 120 and not any(b.proofs for b in made)
    assert daemon.reloader.proving is None


def switch_and_fail(tmp_path: Path, rollback: bool) -> tuple[Any, dict[str, FakeBackend], Any]:
    """qwen SERVING, a reload to a new image that passes its proof, then the new spec's start fails for good."""
    from spark_supervisor.model import Kind, StartContainer
    from spark_supervisor.world.act import ActionFailed
    from tests.helpers import obs
    daemon, be, clock, path, d = running(tmp_path)
    d2 = copy.deepcopy(d)
    d2["deployments"][0].setdefault("ray", {})["image"] = NEW_IMAGE
    d2["changes"] = {"rollback": rollback}
    reload_to(daemon, clock, path, d2)
    new = daemon.reconcilers["qwen"]
    assert new.view.dep.ray.image == NEW_IMAGE
    be["qwen"].fail[StartContainer] = ActionFailed(Kind.IMAGE_MISSING, f"{NEW_IMAGE} is not on spark-1",
                                                   deterministic=True)
    be["qwen"].next = obs(new.view.cfg)  # the old containers gone: the new spec starts, and fails
    ticks_until(daemon, lambda: new.view.dep.ray.image != NEW_IMAGE or new.status.phase == Phase.FAILED)
    return daemon, be, new


def test_a_switched_spec_that_fails_before_it_serves_is_rolled_back_to_the_one_that_served(tmp_path: Path) -> None:
    daemon, be, new = switch_and_fail(tmp_path, rollback=True)
    assert new.view.dep.ray.image != NEW_IMAGE  # the spec that served runs again
    notes = [str(r) for r in daemon.stack.rollbacks.notes]
    assert len(notes) == 1 and notes[0].startswith("RolledBack: qwen: ImageMissing: ") and NEW_IMAGE in notes[0]
    assert notes[0] in daemon.status_line()
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert doc["reload"]["rolled_back"] == notes
    assert daemon.reconcilers["embed"].status.phase == Phase.SERVING  # the other deployment untouched


def test_with_rollback_off_a_failed_switch_stays_failed(tmp_path: Path) -> None:
    daemon, be, new = switch_and_fail(tmp_path, rollback=False)
    assert new.view.dep.ray.image == NEW_IMAGE and new.status.phase == Phase.FAILED
    assert not daemon.stack.rollbacks.notes


def test_a_spec_that_served_is_the_way_back_even_when_a_repair_runs_at_the_switch() -> None:
    """The noisy run's case: the proof began beside the serving spec, a repair of that spec was under way when
    it ended; the spec had served (its images pinned), so it is still the way back."""
    import structlog

    from spark_supervisor.change.rollback import Rollbacks
    from spark_supervisor.model import Status
    from spark_supervisor.reconcile.reconciler import Reconciler
    from tests.helpers import cfg, view_of

    view = view_of(cfg())
    for phase, pinned, armed in [(Phase.LOADING, {"spark-1": "sha256:a"}, True), (Phase.LOADING, {}, False),
                                 (Phase.SERVING, {}, True)]:
        st = Status(phase=phase, pinned=pinned)
        before = cast(Reconciler, SimpleNamespace(status=st, view=view))
        rb = Rollbacks(structlog.get_logger())
        rb.switched("qwen", before, view)
        assert ("qwen" in rb.probation) == armed, (phase, pinned)


def switched(tmp_path: Path) -> tuple[Any, dict[str, FakeBackend], Any, Any]:
    """qwen SERVING on pinned images, then switched to a new image that passed its proof, its start under way."""
    daemon, be, clock, path, d = running(tmp_path)
    daemon.reconcilers["qwen"].status.pinned = {"spark-1": "sha256:served1", "spark-2": "sha256:served2"}
    d2 = copy.deepcopy(d)
    d2["deployments"][0].setdefault("ray", {})["image"] = NEW_IMAGE
    reload_to(daemon, clock, path, d2)
    new = daemon.reconcilers["qwen"]
    assert new.view.dep.ray.image == NEW_IMAGE and "qwen" in daemon.stack.rollbacks.probation
    return daemon, be, clock, new


def test_one_transient_failure_of_the_new_spec_is_retried_on_it_not_rolled_back(tmp_path: Path) -> None:
    """Issue 42, item 8: a Docker timeout during the new spec's start drops nothing; the budget's worth does."""
    from spark_supervisor.model import StartContainer
    from spark_supervisor.world.act import ActionFailed
    daemon, be, clock, new = switched(tmp_path)
    be["qwen"].fail[StartContainer] = ActionFailed("DockerTimeout", "create: no answer within 60s")
    ticks_until(daemon, lambda: new.status.phase == Phase.BACKOFF)
    assert new.view.dep.ray.image == NEW_IMAGE and not daemon.stack.rollbacks.notes  # retried on the new spec
    for _ in range(40):  # each retry fails the same, transiently: the budget's worth rolls it back
        if daemon.stack.rollbacks.notes:
            break
        clock.t += 60
        daemon.tick()
    assert new.view.dep.ray.image != NEW_IMAGE and new.status.pinned == {"spark-1": "sha256:served1",
                                                                        "spark-2": "sha256:served2"}
    assert str(daemon.stack.rollbacks.notes[0]).startswith("RolledBack: qwen: DockerTimeout: ")


def test_a_missed_load_deadline_of_the_new_spec_rolls_it_back_at_once() -> None:
    from spark_supervisor.change.rollback import cannot_serve
    from spark_supervisor.model import Kind, Status
    for phase, why, failures, rolls in [
            (Phase.STARTING_VLLM, Reason(Kind.LOAD_TIMEOUT, "not ready after 1200s"), 0, True),
            (Phase.STARTING_VLLM, Reason(Kind.SANITY_FAILED, "empty answer"), 0, True),
            (Phase.BACKOFF, Reason("DockerTimeout", "x"), 1, False),
            (Phase.BACKOFF, Reason("DockerTimeout", "x"), 3, True),  # the testbed's budget: 3
            (Phase.FAILED, Reason(Kind.IMAGE_MISSING, "x"), 0, True)]:
        from tests.helpers import cfg, view_of
        st = Status(phase=phase, why=why, failures=failures)
        r = cast(Any, SimpleNamespace(status=st, view=view_of(cfg())))
        assert cannot_serve(r) is rolls, (phase, why, failures)


def test_the_pins_and_the_way_back_outlive_a_restart_of_the_daemon(tmp_path: Path) -> None:
    """Issue 42, item 7: the daemon restarted (a watchdog, the head's reboot) while the switched spec loads: its
    repairs still start the images that served, and its failure still rolls back to them."""
    from spark_supervisor.model import Kind, StartContainer
    from spark_supervisor.world.act import ActionFailed
    from tests.unit.test_stack import make as make_stack
    daemon, be, clock, new = switched(tmp_path)
    daemon.tick()
    kept = json.loads((tmp_path / "state" / "deployments" / "qwen" / "changes.json").read_text())
    assert kept["way_back"]["pinned"] == {"spark-1": "sha256:served1", "spark-2": "sha256:served2"}
    assert oct((tmp_path / "state" / "deployments" / "qwen" / "changes.json").stat().st_mode & 0o777) == "0o600"
    daemon.stack.close()
    # A new daemon on the same file (the new image) and state directory.
    import tomllib
    d2 = tomllib.loads((tmp_path / "c.toml").read_text())
    again, be2, clock2, _, _ = make_stack(tmp_path, d2)
    q = again.reconcilers["qwen"]
    assert q.view.dep.ray.image == NEW_IMAGE and "qwen" in again.stack.rollbacks.probation
    back, pinned, _ = again.stack.rollbacks.probation["qwen"]
    assert back.dep.ray.image != NEW_IMAGE and pinned == {"spark-1": "sha256:served1", "spark-2": "sha256:served2"}
    assert back.owners == {"qwen", "embed"}  # the other deployment's containers are still nobody's orphans
    from tests.helpers import obs
    be2["qwen"].next = obs(q.view.cfg)
    be2["qwen"].fail[StartContainer] = ActionFailed(Kind.IMAGE_MISSING, f"{NEW_IMAGE} is gone", deterministic=True)
    ticks_until(again, lambda: q.view.dep.ray.image != NEW_IMAGE, most=10)
    assert q.status.pinned == {"spark-1": "sha256:served1", "spark-2": "sha256:served2"}
    assert be2["qwen"].pinned == q.status.pinned  # the rollback's backend starts them by ID


def test_pins_kept_for_another_spec_are_not_restored(tmp_path: Path) -> None:
    from tests.unit.test_stack import make as make_stack
    daemon, be, clock, path, d = running(tmp_path)
    daemon.reconcilers["qwen"].status.pinned = {"spark-1": "sha256:served1"}
    daemon.tick()
    assert json.loads((tmp_path / "state" / "deployments" / "qwen" / "changes.json").read_text())["pinned"]
    daemon.stack.close()
    d2 = copy.deepcopy(d)
    d2["deployments"][0].setdefault("ray", {})["image"] = NEW_IMAGE  # edited while the daemon was down
    again, *_ = make_stack(tmp_path, d2)
    assert again.reconcilers["qwen"].status.pinned == {} and not again.stack.rollbacks.probation
    same, *_ = make_stack(tmp_path, d)
    assert same.reconcilers["qwen"].status.pinned == {"spark-1": "sha256:served1"}


def test_a_share_that_cannot_fit_once_the_old_serve_stops_is_refused_before_anything_stops(tmp_path: Path) -> None:
    """Issue 42, item 10: the new gpu_memory_utilization against what will be free once the serve that runs
    stops (MemAvailable now plus its share), from the last full reading: refused with the old one serving."""
    import dataclasses

    from spark_supervisor.model import Memory
    daemon, be, clock, path, d = running(tmp_path)
    qwen = daemon.reconcilers["qwen"]
    assert qwen.last_full is not None
    total, share = 122880, qwen.view.dep.serve.gpu_memory_utilization
    beside = 8000 + int(total * 0.1)  # what the node uses beside the serve: the desktop, and embed's serve
    nodes = {n: dataclasses.replace(o, memory=Memory(total, int(total * (1 - share)) - beside))
             for n, o in qwen.last_full.nodes.items()}
    qwen.last_full = dataclasses.replace(qwen.last_full, nodes=nodes)
    made = recording(daemon)
    d2 = copy.deepcopy(d)
    d2["deployments"][0]["serve"]["gpu_memory_utilization"] = 0.85  # with embed's 0.1: valid, yet no room
    reload_to(daemon, clock, path, d2)
    why = daemon.reloader.refused["qwen"]
    assert why.kind == "ChangeRefused" and why.detail.startswith(
        "FreeMemoryBelowUtilization on spark-1: gpu_memory_utilization 0.85 asks for 104448 MiB of 122880 MiB, but "
        "about 102591 MiB will be free once the running serve stops (MemAvailable 4287 MiB + its share 98304 MiB)"), why
    assert not made and qwen.status.phase == Phase.SERVING and qwen.view.dep.serve.gpu_memory_utilization == share
    d2["deployments"][0]["serve"]["gpu_memory_utilization"] = 0.82  # fits: proven and applied as any change
    reload_to(daemon, clock, path, d2)
    assert daemon.reconcilers["qwen"].view.dep.serve.gpu_memory_utilization == 0.82 and not daemon.reloader.refused


def test_a_serve_command_changed_alone_is_checked_again_in_the_image() -> None:
    """Issue 42, item 10: the image check kept for the old command would pass one the image lacks."""
    from spark_supervisor import config
    from tests.helpers import cfg, data
    a = data()
    b = copy.deepcopy(a)
    b["deployments"][0]["serve"]["command"] = ["/opt/venv/bin/no-such-vllm", "serve"]
    ca, cb = cfg(a), cfg(b)
    assert config.ray_hash(ca, ca.deployment) == config.ray_hash(cb, cb.deployment)  # the same containers
    assert config.image_check_key(ca, ca.deployment) != config.image_check_key(cb, cb.deployment)
