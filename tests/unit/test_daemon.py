"""The loop stepped one tick at a time: fake backend, fake clock, recorded notifications."""

from __future__ import annotations

import itertools
import json
import signal
import threading
from pathlib import Path
from typing import Any

import tomli_w

from spark_supervisor.adapters.retry import backoff_delay
from spark_supervisor.config.view import DeploymentView
from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.model import (
    Action,
    CheckImage,
    EndpointObservation,
    EndpointState,
    Observation,
    Phase,
    StartContainer,
    StartServe,
    Verdict,
)
from spark_supervisor.world.act import ActionFailed
from spark_supervisor.world.backend import Backend
from spark_testbed.testbed import until
from tests.fakes import make
from tests.helpers import data, images, obs, phase_now, ray_ok, serve_running, sole


def test_cold_start_to_serving_sends_ready_once(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    c = daemon.cfg
    be.next = obs(c)
    daemon.tick()
    assert be.ran == [StartContainer("spark-1"), StartContainer("spark-2")] and phase_now(sole(daemon).status) == Phase.STARTING_RAY
    be.next = obs(c, deployed=True)
    daemon.tick()
    assert be.ran[-1] == StartServe()
    s = serve_running(c)
    be.next = obs(c, deployed=True, serve=s, endpoint=EndpointObservation(EndpointState.REFUSED))
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.LOADING
    assert not any(n.startswith("READY=1") for n in notes.sent)
    be.next = obs(c, deployed=True, serve=s, endpoint=EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",)))
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.VERIFYING and sole(daemon).status.verdict is not None
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.SERVING
    daemon.tick()
    assert [n for n in notes.sent if n.startswith("READY=1")] == ["READY=1\nSTATUS=SERVING Qwen3.5 on 2 nodes"]
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert doc["phase"] == "SERVING" and doc["verdict"]["passed"]
    assert [h["phase"] for h in doc["history"]] == ["STARTING_RAY", "STARTING_VLLM", "LOADING", "VERIFYING", "SERVING"]


def test_failures_back_off_exponentially_and_the_status_says_why(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)
    be.fail[StartContainer] = ActionFailed("DockerError", "500 Server Error: engine hiccup")
    waits = []
    for _ in range(4):
        daemon.tick()
        assert sole(daemon).status.phase == Phase.BACKOFF
        waits.append(sole(daemon).status.backoff_until - clock.t)
        # Nothing is retried before its time.
        n = len(be.ran)
        clock.t += waits[-1] / 2
        daemon.tick()
        assert len(be.ran) == n
        clock.t = sole(daemon).status.backoff_until
    assert waits == [5, 10, 20, 40]
    last = [n for n in notes.sent if n.startswith("STATUS=")][-1]
    assert last.startswith("STATUS=BACKOFF retry 4 in ") and "engine hiccup" in last


def test_backoff_delay_is_capped_and_jittered() -> None:
    assert backoff_delay(1, 5, 300, 1.0) == 5
    assert backoff_delay(20, 5, 300, 1.0) == 300
    assert backoff_delay(3, 5, 300, 0.0) == 10


def test_reload_with_a_broken_file_keeps_the_old_config(tmp_path: Path) -> None:
    daemon, be, clock, notes, path = make(tmp_path)
    old = daemon.cfg
    path.write_text("[nodes\n")
    daemon.reload()  # before the first READY=1: a reload must not end the start
    assert daemon.cfg is old and not be.closed
    assert notes.sent[0].startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert notes.sent[-1].startswith("STATUS=") and "reload failed" in notes.sent[-1]
    daemon.reporter.ready_sent = True
    daemon.reload()
    assert notes.sent[-1].startswith("READY=1\nSTATUS=") and "not valid TOML" in notes.sent[-1]
    assert "reload failed" in daemon.status_line()  # and it stays there until a reload succeeds


def test_reload_with_a_changed_interval_applies_in_place(tmp_path: Path) -> None:
    daemon, be, clock, notes, path = make(tmp_path)
    d = data()
    d["supervisor"] = {"state_dir": str(tmp_path / "state"), "interval": 2}
    path.write_text(tomli_w.dumps(d))
    daemon.reload()
    assert daemon.cfg.supervisor.interval == 2 and be.closed


def test_a_second_sigterm_exits_at_once(tmp_path: Path) -> None:
    daemon, *_ = make(tmp_path)
    daemon._on_signal(signal.SIGTERM, None)
    try:
        daemon._on_signal(signal.SIGTERM, None)
    except SystemExit as e:
        assert e.code == 1
    else:
        raise AssertionError("no exit")


def test_status_lines_are_ascii() -> None:
    from spark_supervisor.report.notify import ascii_status
    assert ascii_status("LOADING 12/39 shards \u2014 ETA 8m\n") == "LOADING 12/39 shards ? ETA 8m "


def test_start_timeout_is_extended_only_while_the_start_progresses(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    c = daemon.cfg
    be.next = obs(c)
    be.fail[StartContainer] = ActionFailed("DockerError", "boom")
    daemon.tick()  # a change (DETECTING -> BACKOFF) is progress
    assert notes.sent[-1] == "EXTEND_TIMEOUT_USEC=180000000"
    for _ in range(200):  # the same failure over and over is not progress
        clock.t = sole(daemon).status.backoff_until
        notes.sent.clear()
        daemon.tick()
        if clock.t - sole(daemon).last_progress > c.supervisor.start_stall_timeout:
            break
    assert not any(n.startswith("EXTEND_TIMEOUT_USEC") for n in notes.sent)


def test_a_deterministic_failure_is_failed_until_reset(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)
    be.fail[StartContainer] = ActionFailed("ImageMissing", "vllm/vllm-openai:latest is not on spark-1", deterministic=True)
    daemon.tick()
    assert sole(daemon).status.phase == Phase.FAILED and sole(daemon).status.reason.startswith("ImageMissing")
    n = len(be.ran)
    clock.t += 3600
    daemon.tick()
    assert sole(daemon).status.phase == Phase.FAILED and len(be.ran) == n  # still reporting, not retrying
    del be.fail[StartContainer]
    daemon.rearm("reset")
    daemon.tick()  # a reset checks the image again (it may have been fixed under the same name), then starts
    assert be.ran[-4:-2] == [CheckImage("spark-1", model_later=True), CheckImage("spark-2", model_later=True)]
    assert phase_now(sole(daemon).status) == Phase.STARTING_RAY


def test_the_image_is_checked_on_every_node_before_anything_starts(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    sole(daemon).status.images = {}
    be.next = obs(daemon.cfg)
    daemon.tick()  # the check, then (the same tick, the same observation) the start
    assert be.ran == [CheckImage("spark-1", model_later=True), CheckImage("spark-2", model_later=True), StartContainer("spark-1"),
                      StartContainer("spark-2")]
    assert sole(daemon).status.images == be.reports
    assert [h.kind for h in sole(daemon).status.history] == ["CheckingImage", ""]


def test_an_image_without_ray_is_failed_before_any_container_starts(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    sole(daemon).status.images = {}
    be.reports = images(daemon.cfg, ray_path="", ray_version="", ray_python="", dashboard=False)
    be.next = obs(daemon.cfg)
    daemon.tick()
    assert sole(daemon).status.phase == Phase.FAILED and sole(daemon).status.reason.startswith("ImageLacksRay: spark-1, spark-2")
    assert 'distributed_executor_backend = "mp"' in sole(daemon).status.reason
    assert not [a for a in be.ran if not isinstance(a, CheckImage)]
    clock.t += 3600
    daemon.tick()
    assert sole(daemon).status.phase == Phase.FAILED and len(be.ran) == 2  # not checked again until a reset


def test_without_a_dashboard_the_ray_head_starts_without_one(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    sole(daemon).status.images = {}
    be.reports = images(daemon.cfg, dashboard=False)
    be.next = obs(daemon.cfg)
    daemon.tick()
    assert be.ran[2:] == [StartContainer("spark-1", dashboard=False), StartContainer("spark-2", dashboard=False)]


def test_the_repair_budget_survives_a_daemon_restart(tmp_path: Path) -> None:
    from dataclasses import replace as dc_replace
    daemon, be, clock, notes, _ = make(tmp_path)
    c = daemon.cfg
    dead = dc_replace(serve_running(c), running=False, exit_code=137)
    be.next = obs(c, deployed=True, serve=dead)
    for _ in range(3):
        clock.t = max(clock.t, sole(daemon).status.next_repair_at) + 1
        daemon.tick()
        assert sole(daemon).status.phase == Phase.STARTING_VLLM
    again, be2, clock2, _, _ = make(tmp_path)
    clock2.t = clock.t  # the same wall clock after the restart (entries from the future would not count)
    be2.next = obs(c, deployed=True, serve=dead)
    again.tick()
    assert sole(again).status.phase == Phase.FAILED and sole(again).status.reason.startswith("RestartBudgetExhausted: 3 repairs")
    again.rearm("reset")
    again.tick()
    assert phase_now(sole(again).status) == Phase.STARTING_VLLM


def test_backoff_never_overflows_after_very_many_failures() -> None:
    assert backoff_delay(10_000, 5, 300, 1.0) == 300
    assert backoff_delay(2**40, 5, 300, 0.0) == 150


def test_an_action_that_fails_deterministically_is_failed_not_retried(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)

    def missing(action: Action) -> Verdict | None:  # noqa: ARG001  (it replaces Backend.run(action))
        raise ActionFailed("ImageMissing", "x is not on spark-1", deterministic=True)
    be.run = missing  # type: ignore[method-assign]
    daemon.tick()
    assert sole(daemon).status.phase == Phase.FAILED and sole(daemon).status.reason.startswith("ImageMissing")


def test_a_reload_of_a_file_that_is_not_utf8_keeps_the_old_config(tmp_path: Path) -> None:
    daemon, be, clock, notes, path = make(tmp_path)
    before = daemon.cfg
    path.write_bytes(b"\xff\xfe[supervisor]\n\x00\x81")
    daemon.reload()
    assert daemon.cfg is before and daemon.reloader.reload_error.startswith(str(path))
    assert "reload failed" in daemon.status_line()


def test_a_reload_whose_backend_cannot_be_built_keeps_the_old_one(tmp_path: Path) -> None:
    daemon, be, clock, notes, path = make(tmp_path)
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    d["supervisor"]["interval"] = 7
    path.write_text(tomli_w.dumps(d))

    def broken(_view: DeploymentView) -> Backend:
        raise OSError("too many open files")
    daemon.stack.backend_factory = broken
    daemon.reload()
    assert sole(daemon).backend is be and not be.closed and daemon.cfg.supervisor.interval != 7
    assert "too many open files" in daemon.reloader.reload_error


def test_the_start_timeout_is_extended_only_while_the_start_progresses(tmp_path: Path) -> None:
    from dataclasses import replace

    from spark_supervisor.model import GpuProcess
    from tests.helpers import free_gpu, node_obs
    d = data(stale={"units": [], "memory_free_timeout": 3000})
    daemon, be, clock, notes, _ = make(tmp_path, d)
    c = daemon.cfg
    held = replace(free_gpu(), processes=(GpuProcess(4242, "python3", 19135),))
    be.next = obs(c, nodes={"spark-1": node_obs("spark-1", gpu=held), "spark-2": node_obs("spark-2")})
    extends = []
    for _ in range(60):
        daemon.tick()
        extends.append(sum(n.startswith("EXTEND_TIMEOUT_USEC") for n in notes.sent))
        clock.t += 30
    assert sole(daemon).status.phase == Phase.CLEANING
    # Waiting in one place extends the start for start_stall_timeout (1200 s), then no more.
    stall = daemon.cfg.supervisor.start_stall_timeout
    assert extends[-1] == extends[-5] and extends[-1] <= stall / 30 + 2


def test_repairs_json_of_the_wrong_shape_is_moved_aside_and_the_daemon_goes_on(tmp_path: Path) -> None:
    state = tmp_path / "state"
    own = state / "deployments" / "qwen"  # each deployment keeps its repair log in its own directory
    own.mkdir(parents=True)
    (own / "repairs.json").write_text('{"not": "a list"}')
    daemon, be, clock, notes, _ = make(tmp_path)
    assert sole(daemon).repairs.entries == [] and "moved aside" in sole(daemon).repairs.problem
    assert [p.name for p in own.iterdir() if p.name.startswith("repairs.json.bad-")]
    be.next = obs(daemon.cfg)
    daemon.tick()
    doc = json.loads((state / "status.json").read_text())
    assert any("moved aside" in p for p in doc["state_problems"])


def test_budget_entries_from_the_future_are_not_counted(tmp_path: Path) -> None:
    from spark_supervisor.state.statefile import RepairLog
    log = RepairLog(str(tmp_path))
    log.add(2000.0, "gang", "x")
    log.add(1000.0, "serve", "y")
    assert [e["kind"] for e in log.recent(1500.0, 3600)] == ["serve"]
    assert RepairLog(str(tmp_path)).entries == log.entries  # persisted


def test_a_failed_repairs_write_is_shown_not_swallowed(tmp_path: Path) -> None:
    from spark_supervisor.state.statefile import RepairLog
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = RepairLog(str(blocker / "sub"))  # a state dir below a file: every write fails
    log.add(1.0, "gang", "x")
    assert log.entries and log.problem.startswith("cannot write")


def test_reset_reaches_the_daemon_through_its_control_socket(tmp_path: Path) -> None:
    from spark_supervisor.state import control
    daemon, be, clock, notes, _ = make(tmp_path)
    sole(daemon).repairs.add(1.7e9 + clock.t, "gang", "x")
    server = control.ControlServer(str(tmp_path / "state"), daemon._on_request)
    try:
        assert "re-arm" in control.request(str(tmp_path / "state"), "reset")
        assert list(daemon._signals) == ["reset"]
        with __import__("pytest").raises(control.Refused, match="unknown command"):  # answered: not Unavailable
            control.request(str(tmp_path / "state"), "rm -rf")
    finally:
        server.close()
    with __import__("pytest").raises(control.Unavailable):
        control.request(str(tmp_path / "state"), "reset")
    assert not control.daemon_holds_lock(str(tmp_path / "state"))


def test_a_start_with_far_less_kv_cache_than_the_best_for_its_spec_is_a_warning(tmp_path: Path) -> None:
    from spark_supervisor.config import serve_hash
    daemon, be, clock, notes, _ = make(tmp_path)
    c = daemon.cfg
    state = tmp_path / "state"
    own = state / "deployments" / "qwen"
    own.mkdir(parents=True, exist_ok=True)
    (own / "kv.json").write_text(json.dumps({serve_hash(c, c.deployment): 409856}))
    log = ("(EngineCore pid=1) INFO 12-02 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: 200,000 tokens\n"
           "INFO:     Application startup complete.\n")
    be.next = obs(c, deployed=True, serve=serve_running(c, log=log),
                  endpoint=EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",)))
    daemon.tick()
    kv = sole(daemon).status.kv_cache
    assert kv is not None and kv.tokens == 200000 and kv.best == 409856
    assert kv.warning.startswith("KvCacheRegression: 200,000")
    doc = json.loads((state / "status.json").read_text())
    assert doc["kv_cache"]["warning"].startswith("KvCacheRegression")
    # A better start raises the best, persisted.
    daemon2, be2, _, _, _ = make(tmp_path)
    log2 = log.replace("200,000", "500,000")
    be2.next = obs(c, deployed=True, serve=serve_running(c, log=log2, pid=78),
                   endpoint=EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",)))
    daemon2.tick()
    kv2 = sole(daemon2).status.kv_cache
    assert kv2 is not None and not kv2.warning
    assert json.loads((own / "kv.json").read_text())[serve_hash(c, c.deployment)] == 500000


def test_a_load_that_moved_on_the_tick_it_would_have_stalled_is_not_stalled(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    c = daemon.cfg

    def loading(shard: int) -> Observation:
        bar = f"Loading safetensors checkpoint shards:  {shard * 100 // 39}% Completed | {shard}/39 [00:40<01:30]\r"
        return obs(c, deployed=True, serve=serve_running(c, log=bar), endpoint=EndpointObservation(EndpointState.REFUSED))
    be.next = loading(1)
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.LOADING
    clock.t += c.deployment.readiness.stall_timeout + 1
    be.next = loading(2)  # it moved just now: judged on this tick's progress, not the last one's
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.LOADING and not sole(daemon).repairs.recent(daemon.wall(), 3600)
    clock.t += c.deployment.readiness.stall_timeout + 1
    daemon.tick()  # and now it has not moved for longer than the stall timeout
    assert sole(daemon).status.reason.startswith("LoadStalled")


def test_the_launch_goes_on_from_the_reading_that_started_the_containers_and_a_relaunch_reads_again(
        tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg, at=clock.t)
    daemon.tick()
    assert be.ran == [StartContainer("spark-1"), StartContainer("spark-2")]
    assert sole(daemon).status.admitted == (1, clock.t)
    be.ran.clear()
    clock.t += 10
    be.next = obs(daemon.cfg, deployed=True, ray=ray_ok(daemon.cfg), full=False, at=clock.t)
    daemon.tick()  # Ray formed, seen by a quick look: launched on that tick, not after one spent reading memory
    assert be.ran == [StartServe()] and sole(daemon).status.admitted is None



def test_a_reset_during_the_join_reads_the_memory_again_before_the_launch(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg, at=clock.t)
    daemon.tick()
    assert sole(daemon).status.admitted is not None
    daemon.rearm("reset")  # a reload may ask for more memory than the reading admitted
    assert sole(daemon).status.admitted is None


def test_every_start_checks_the_images_again(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)
    daemon.tick()
    assert be.ran == [StartContainer("spark-1"), StartContainer("spark-2")] and sole(daemon).status.starts == 1
    be.ran.clear()
    daemon.tick()  # nothing came up (or it was torn down): the next start checks first (kept by image ID)
    assert be.ran == [CheckImage("spark-1", model_later=True), CheckImage("spark-2", model_later=True), StartContainer("spark-1"),
                      StartContainer("spark-2")]


def test_the_heads_container_starts_alone_then_the_others_at_once() -> None:
    from spark_supervisor.reconcile.reconciler import _at_once
    starts = (StartContainer("spark-1"), StartContainer("spark-2"), StartContainer("spark-3"))
    assert [_at_once(starts, i) for i in range(3)] == [False, True, True]
    checks = (CheckImage("spark-1"), CheckImage("spark-2"))
    assert [_at_once(checks, i) for i in range(2)] == [True, True]


def test_a_tick_that_takes_time_does_not_rewrite_an_unchanged_status_file(tmp_path: Path) -> None:
    """The document turns monotonic instants (a performance verdict's) into wall times: with the offset taken
    from the two clocks read together, not from the tick's start, how long a tick took changes nothing in it,
    and the status file waits for a change (or its refresh) instead of being rewritten every tick."""
    from spark_supervisor.model.status import PerfVerdict

    daemon, be, clock, _, _ = make(tmp_path)
    c = daemon.cfg
    up = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
    be.next = obs(c, deployed=True, serve=serve_running(c), endpoint=up)
    for _ in range(4):
        daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.SERVING
    sole(daemon).status.perf = PerfVerdict("serve", clock.t - 30.0, 0.1, 40.0)
    seen, took = be.observe, itertools.count(1)

    def slow(full: bool) -> Observation:  # each tick's observation takes its time, a different one each tick
        clock.t += 0.0137 * next(took)
        return seen(full)
    be.observe = slow  # type: ignore[method-assign]
    status = tmp_path / "state" / "status.json"
    daemon.tick()
    written, measured = status.stat().st_ino, json.loads(status.read_text())["performance"]["measured"]
    for _ in range(3):
        clock.t += 5.0
        daemon.tick()
        assert json.loads(status.read_text())["performance"]["measured"] == measured
    assert status.stat().st_ino == written  # not replaced: nothing in it changed


def test_a_node_unseen_by_full_observations_stays_unknown_until_one_sees_it_and_degrades_after_the_patience(
        tmp_path: Path) -> None:
    """A hung containerd: `docker version` and the serve-state exec (full observations) time out, while a steady
    sweep keeps the engine's listing (its event stream is silent, not ended) and trusts /health. The steady
    sweep must not count as having seen the node: each tick looks fully while something is unseen, the run of
    unknowns is unbroken, and DEGRADED comes after the patience, with no flapping "known again" in between."""
    from dataclasses import replace

    from spark_supervisor.model import EngineStats
    daemon, be, clock, _, _ = make(tmp_path)
    c = daemon.cfg
    up = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
    fine = replace(obs(c, deployed=True, serve=serve_running(c), endpoint=up), engine=EngineStats())
    hung = replace(fine, nodes={**fine.nodes, "spark-1": replace(fine.nodes["spark-1"],
                                                                  error="ObserveTimeout: no answer within 11s")})

    def tick(full: Observation, steady: Observation | None = None) -> None:
        be.next, be.steady = replace(full, at=clock.t), steady and replace(steady, full=False, at=clock.t)
        daemon.tick()
        clock.t += 5
    for _ in range(3):
        tick(fine, fine)
    assert phase_now(sole(daemon).status) == Phase.SERVING and not all(be.asked)  # steady sweeps while all is seen
    asked = len(be.asked)
    t0 = clock.t
    while clock.t - t0 <= c.supervisor.full_observe_interval + c.healing.unknown_patience + 30:
        tick(hung, fine)  # a steady sweep sees nothing wrong
        if True in be.asked[asked:]:  # from the first full observation on
            assert "node spark-1" in sole(daemon).status.unknown_since, "known again while nothing has seen it"
            assert all(be.asked[be.asked.index(True, asked):]), "a steady sweep while the node is unseen"
    assert phase_now(sole(daemon).status) == Phase.DEGRADED and sole(daemon).status.why.kind == "ObservationUnknown"
    tick(fine)  # containerd answers again: a full observation sees it, and it is known again
    assert "node spark-1" not in sole(daemon).status.unknown_since and phase_now(sole(daemon).status) == Phase.SERVING


def serving_at_a_slow_quick_interval(tmp_path: Path) -> tuple[Daemon, Any]:
    """SERVING with quick checks a minute apart: between them, only a cue (or a signal) makes the loop look."""
    daemon, be, *_ = make(tmp_path, data(healing={"quick_check_interval": 60}))
    c = daemon.cfg
    be.next = obs(c, deployed=True, serve=serve_running(c),
                  endpoint=EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",)))
    for _ in range(4):
        daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.SERVING and sole(daemon).quick_interval() == 60
    return daemon, be


def waiting_in_a_thread(daemon: Daemon) -> threading.Thread:
    """The loop's wait between ticks, for ever but for a break: the fake clock never reaches its deadline."""
    waiting = threading.Thread(target=daemon.waiting.wait, daemon=True,
                               args=(1e6, daemon.reconcilers.values(), lambda: bool(daemon._signals)))
    waiting.start()
    return waiting


def test_a_cue_runs_the_quick_checks_at_once_and_the_loop_ticks_only_if_they_saw_a_change(tmp_path: Path) -> None:
    """A process in a container of ours ended (an engine's event, adapters/docker.py): the quick checks run at once,
    not at their interval; with nothing changed the wait goes on, and a change ends it (the loop ticks)."""
    daemon, be = serving_at_a_slow_quick_interval(tmp_path)
    same = sole(daemon).watch.fingerprint
    answers, asked = [same, (same[0], "refused")], []

    def quick() -> Any:
        asked.append(1)
        return answers[len(asked) - 1]
    be.quick = quick
    waiting = waiting_in_a_thread(daemon)
    daemon.waiting.cue()
    until(lambda: len(asked) == 1, 10, "the quick checks a cue asks for")
    daemon.waiting.cue()
    waiting.join(10)
    assert not waiting.is_alive() and len(asked) == 2, "a cue whose checks saw nothing changed ended the wait"


def test_a_signal_beside_a_cue_still_ends_the_wait(tmp_path: Path) -> None:
    """Both came before the loop woke: the cue's checks see nothing changed, and the signal is not lost in them."""
    daemon, be = serving_at_a_slow_quick_interval(tmp_path)
    same = sole(daemon).watch.fingerprint
    be.quick = lambda: same
    daemon._on_request("reset")
    daemon.waiting.cue()
    waiting = waiting_in_a_thread(daemon)
    waiting.join(10)
    assert not waiting.is_alive() and list(daemon._signals) == ["reset"]
