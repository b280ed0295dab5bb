"""The status document has one shape (model/document.py: StatusDoc, DeploymentDoc and the TypedDicts of every
object in them) for its writer and its readers. mypy holds the writer to it and a reader's `doc["key"]`; what
it cannot see, these tests do:

- a reader's `doc.get("key")` (a TypedDict's get takes any key): every key `status` reads is one the daemon
  writes, in the very object it reads it from (the disagreement the review found: "fraction" written,
  "load_fraction" read);
- the writer's casts of dataclasses.asdict: each TypedDict that mirrors a model dataclass has its fields as
  keys, and a document with every part filled in, read back from the file, has the types it says."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import time
import typing
from collections.abc import Sequence
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

import pytest

from spark_supervisor.cli import status
from spark_supervisor.judge import logscan
from spark_supervisor.model import (
    EndpointObservation,
    EndpointState,
    Gpu,
    GpuProcess,
    ImageReport,
    KvCache,
    Link,
    LoadLimits,
    Memory,
    ModelReport,
    Observation,
    Pause,
    Phase,
    RayNode,
    RayObservation,
    ServeObservation,
    Status,
    Tracker,
    Transition,
    Verdict,
)
from spark_supervisor.model import document as doc_types
from spark_supervisor.model.document import (
    BackendDoc,
    ContainerDoc,
    DaemonDoc,
    DeploymentDoc,
    EngineDoc,
    GoalDoc,
    GpuDoc,
    HistoryDoc,
    HostDoc,
    KvCacheDoc,
    LinkDoc,
    LoadDoc,
    LoadLimitsDoc,
    MemoryDoc,
    NodeDoc,
    PerfDoc,
    RankDoc,
    RayDoc,
    RdmaPortDoc,
    ReloadDoc,
    RepairsDoc,
    ServeDoc,
    StatusDoc,
    StepDoc,
    TransportDoc,
    UnknownDoc,
    VerdictDoc,
)
from spark_supervisor.report import statusdoc
from spark_supervisor.state import statefile
from tests.helpers import cfg, node_obs, ray_container, view_of


def keys(td: type) -> frozenset[str]:
    """A TypedDict's keys, required or not."""
    return frozenset(typing.get_type_hints(td))


def test_the_written_document_has_exactly_its_keys() -> None:
    d = statusdoc.document(Status(phase=Phase.SERVING), None, view_of(cfg()), "/etc/x.toml", "abc", time.time(), 0.0)
    assert DeploymentDoc.__required_keys__ <= set(d) <= keys(DeploymentDoc)


# ---- the readers' keys --------------------------------------------------------------------------------

# What the renderers' variables hold, function by function (cli/status.py). Every `NAME.get("key")` and
# `NAME["key"]` there, on one of them or on a chain from one (`one["deployment"].get("required")`), must
# name a key of what it holds; a read on anything else fails too, until its variable is named here.
HOLDS: dict[str, dict[str, type]] = {
    "status_code": {"doc": StatusDoc, "d": DeploymentDoc},
    "_required": {"doc": DeploymentDoc, "dep": GoalDoc},
    "cmd_status": {"doc": StatusDoc, "daemon": DaemonDoc},
    "_print_status": {"doc": StatusDoc, "one": DeploymentDoc, "reload": ReloadDoc},
    "_print_deployment": {"doc": DeploymentDoc, "dep": GoalDoc, "lim": LoadLimitsDoc, "b": BackendDoc, "ray": RayDoc,
                          "load": LoadDoc, "x": StepDoc, "kv": KvCacheDoc, "u": UnknownDoc, "v": VerdictDoc, "rep": RepairsDoc,
                          "h": HistoryDoc},
    "_print_transports": {"doc": DeploymentDoc, "t": TransportDoc},
    "_print_serve": {"doc": DeploymentDoc, "serve": ServeDoc, "r": RankDoc, "e": EngineDoc, "v": PerfDoc},
    "_fabric": {"h": HostDoc, "link": LinkDoc, "p": RdmaPortDoc},
    "_perf": {"v": PerfDoc},
    "_engine": {"e": EngineDoc},
    "_print_node": {"n": NodeDoc, "gpu": GpuDoc, "mem": MemoryDoc, "c": ContainerDoc},
    "cmd_follow": {"doc": StatusDoc},
    "_age_s": {"doc": StatusDoc},
}


def _typeddict(hint: object) -> type | None:
    """The TypedDict a key's type holds (``X``, ``X | None``), if any."""
    if typing.is_typeddict(hint):
        return typing.cast(type, hint)
    if typing.get_origin(hint) in (UnionType, typing.Union):
        return next((t for a in typing.get_args(hint) if (t := _typeddict(a)) is not None), None)
    return None


def _read(node: ast.AST) -> tuple[ast.expr, str] | None:
    """(what is read from, the key) for `X.get("key", ...)` and `X["key"]`."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.func.value, node.args[0].value
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.value, node.slice.value
    return None


def _holds(node: ast.expr, names: dict[str, type]) -> type | None:
    """The part of the document ``node`` holds, when the test can tell."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    read = _read(node)
    if read is None:
        return None
    outer = _holds(read[0], names)
    return _typeddict(typing.get_type_hints(outer).get(read[1])) if outer is not None else None


def reads(path: Path) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """The reads of a renderer module: (line, the part read, its key) for each the test can place, and
    (line, key) for those it cannot."""
    placed, unplaced = [], []
    for func in ast.parse(path.read_text()).body:
        if not isinstance(func, ast.FunctionDef):
            continue
        names = HOLDS.get(func.name, {})
        for node in ast.walk(func):
            read = _read(node)
            if read is None or not isinstance(node, ast.expr):
                continue
            on = _holds(read[0], names)
            if on is None:
                unplaced.append((node.lineno, read[1]))
            else:
                placed.append((node.lineno, on.__name__, read[1]))
    return placed, unplaced


def test_every_key_status_reads_is_written_in_the_object_it_reads() -> None:
    placed, unplaced = reads(Path(status.__file__))
    assert len(placed) > 100, placed  # the scan finds the reader's reads (it would pass vacuously otherwise)
    assert not unplaced, f"cli/status.py reads keys on something the test cannot place (name it in HOLDS): {unplaced}"
    unknown = [(line, on, key) for line, on, key in placed if key not in keys(getattr(doc_types, on))]
    assert not unknown, f"cli/status.py reads keys the daemon never writes there: {unknown}"


def test_a_misread_key_is_caught() -> None:
    """The scan itself: a key the writer does not write, read with .get on a part or on a chain to it."""
    names: dict[str, type] = {"doc": DeploymentDoc}
    for text in ('doc.get("fraction")', 'doc["deployment"].get("require")', 'doc["serve"]["ranks"]'):
        node = ast.parse(text, mode="eval").body
        read = _read(node)
        assert read is not None
        on = _holds(read[0], names)
        assert on is not None and (read[1] in keys(on)) == (text == 'doc["serve"]["ranks"]'), text


# ---- the writer's casts: each mirror of a dataclass and its fields ----------------------------------------

# Each TypedDict the writer casts dataclasses.asdict of a model dataclass to, with the keys it adds to the
# dataclass's fields and those it leaves out.
MIRRORS: dict[str, tuple[type, set[str], set[str]]] = {
    "VerdictDoc": (Verdict, set(), set()),
    "TrackerDoc": (Tracker, set(), set()),
    "KvCacheDoc": (KvCache, set(), {"serve"}),  # which serve it was read from: the daemon's own business
    "LoadLimitsDoc": (LoadLimits, set(), set()),
    "ImageDoc": (ImageReport, {"summary"}, set()),
    "ModelDoc": (ModelReport, {"summary"}, set()),
    "GpuDoc": (Gpu, set(), set()),
    "GpuProcessDoc": (GpuProcess, set(), set()),
    "MemoryDoc": (Memory, set(), set()),
    "LinkDoc": (Link, set(), set()),
    "RayNodeDoc": (RayNode, set(), set()),
    "EndpointDoc": (EndpointObservation, set(), set()),
    "StepDoc": (logscan.Step, set(), set()),
    "PauseDoc": (Pause, set(), set()),
}


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_each_mirror_has_its_dataclass_fields_as_keys(name: str) -> None:
    cls, added, dropped = MIRRORS[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    assert keys(getattr(doc_types, name)) == (fields - dropped) | added


def test_every_dataclass_the_writer_casts_has_its_mirror_here() -> None:
    """`cast(XDoc, dataclasses.asdict(...))` in statusdoc.py: XDoc must be in MIRRORS (and so held to its fields)."""
    tree = ast.parse(Path(statusdoc.__file__).read_text())
    cast_to = {node.args[0].id for node in ast.walk(tree) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Name) and node.func.id == "cast" and isinstance(node.args[0], ast.Name)}
    assert cast_to and cast_to <= set(MIRRORS), cast_to - set(MIRRORS)


# ---- a document with every part filled in has the types it says ------------------------------------------

def conforms(value: object, hint: object, at: str) -> list[str]:
    """Where a document's ``value`` is not of its type ``hint``: each as "where: what"."""
    if typing.is_typeddict(hint):
        td = typing.cast(type, hint)
        if not isinstance(value, dict):
            return [f"{at}: {value!r}, not a {td.__name__}"]
        hints = typing.get_type_hints(td)  # NotRequired[X] read as X
        out = [f"{at}: no {k!r}" for k in td.__required_keys__ - value.keys()]  # type: ignore[attr-defined]
        out += [f"{at}: {k!r} is not a key of {td.__name__}" for k in value.keys() - hints.keys()]
        return out + [e for k in value.keys() & hints.keys() for e in conforms(value[k], hints[k], f"{at}.{k}")]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (UnionType, typing.Union):  # X | None, all the document has: None, or what X says of it
        some = [a for a in args if a is not NoneType]
        assert len(some) == 1, f"{at}: a union the test does not know: {hint}"
        return [] if value is None and NoneType in args else conforms(value, some[0], at)
    if origin in (list, Sequence):  # a Sequence is a tuple in the writer's hands, a list read back
        if not isinstance(value, list if origin is list else (list, tuple)):
            return [f"{at}: {value!r} is not a {hint}"]
        return [e for i, x in enumerate(value) for e in conforms(x, args[0], f"{at}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{at}: {value!r} is not a {hint}"]
        return [e for k, x in value.items() for e in conforms(k, args[0], f"{at} key")
                + conforms(x, args[1], f"{at}.{k}")]
    if hint is NoneType:
        ok = value is None
    elif hint in (int, float):  # bool is an int to Python, never to the document; an int is a float to JSON
        ok = isinstance(value, int | float if hint is float else int) and not isinstance(value, bool)
    elif hint in (str, bool):
        ok = isinstance(value, typing.cast(type, hint))
    else:
        raise AssertionError(f"{at}: a type the test does not know: {hint}")
    return [] if ok else [f"{at}: {value!r} is not a {getattr(hint, '__name__', hint)}"]


LOG = ("(APIServer pid=1) INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.15.1\n"
       "(EngineCore_DP0 pid=2) INFO 12-02 10:05:05 [kv_cache_utils.py:1] GPU KV cache size: 409,856 tokens\n"
       "(APIServer pid=1) INFO:     Application startup complete.\n")


def full_document() -> StatusDoc:
    """A document with every part the writer can fill in filled in: nodes observed and not, images with and
    without the model's check, Ray, the serve with its log and ranks, a verdict, the KV cache, unknowns."""
    c = cfg()
    st = Status(phase=Phase.SERVING, since_wall=1.7e9, failures=2, backoff_until=30.0, progress="12/39 shards",
                load_fraction=0.33333, eta_s=12.6, repairs_in_window=1, unknown_since={"ray": 40.0},
                unknown_counts={"ray": 3, "gpu": 1}, pinned={"spark-1": "sha256:abc"},
                verdict=Verdict(True, "ok", "s", 0.5, "stop", "content"), health=Tracker(0, 3, "success", 99.0),
                deep=Tracker(1, 0, "failure", 98.0, "bad"), kv_cache=KvCache("id", 100, 200, "KvCacheRegression: less"),
                load_limits=LoadLimits(1200, 900, "configured cold budget", "configured cold budget",
                                       "cold start expected: image changed since the last load"),
                history=[Transition(Phase.LOADING, "x", 20.0, 1.7e9, "K"), Transition(Phase.SERVING, "", 50.5, 1.7e9)])
    model = ModelReport("spark-1", "Qwen/Q", "k", "/c/snapshots/x", "hub", "/c", ("a (gone)",), 3, 1000)
    st.images = {"spark-1": ImageReport("spark-1", "img", "h", 1, "/r", "2.6", "3.12", True, "", "/v", "0.33", "3.12",
                                        model),
                 "spark-2": ImageReport("spark-2", "img", "h", 1)}
    nodes = {"spark-1": node_obs("spark-1", (ray_container(c, "spark-1"),), docker_version="27.0",
                                 probe_errors=("units: x",), memory=Memory(100, 50, 10, 20)),
             "spark-2": node_obs("spark-2", error="SshUnreachable: no", gpu=Gpu("G", "1", 10, 5, (GpuProcess(1, "p", 2),)),
                                 memory=None)}
    ray = RayObservation(True, "", "2.6", (RayNode("a", "1.2.3.4", True, 1.0, True), RayNode("b", "", None, None)))
    serve = ServeObservation(True, 77, "cid", True, None, "sh", "2026-12-02T10:00:00Z", LOG)
    follower = ServeObservation(True, 78, "cid2", False, 1, "sh", "2026-12-02T10:00:01Z")
    obs = Observation(100.0, True, nodes, ray, serve, EndpointObservation(EndpointState.UP, "", 200, ("Q",)),
                      {"spark-2": follower, "spark-3": None})
    d = statusdoc.document(st, obs, view_of(c), "/etc/x.toml", "abc", 1.7e9 + 100, 1.7e9, ("a problem",))
    reload: ReloadDoc = {"error": None, "at": "t", "staged": "s", "proving": None, "refused": ["r"],
                         "rolled_back": ["n"]}
    return {**d, "summary": "SERVING", "deployments": [d], "pause": Pause("ops", "why", 1.7e9, 1.7e9 + 60).to_json(),
            "reload": reload}


def test_a_full_document_has_the_types_it_says_as_written_and_as_read_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = full_document()
    one = doc["deployments"][0]
    # every optional part is there, so each is checked
    assert "load" in one and one["serve"] is not None and "ranks" in one["serve"] and one["ray"] is not None
    assert {"image", "model", "gpu", "memory"} <= set(one["nodes"]["spark-1"])
    assert one["nodes"]["spark-2"]["image"].get("model", "") is None  # the model not checked: null in the image
    assert not conforms(doc, StatusDoc, "doc")
    statefile.write(str(tmp_path), doc)
    assert not conforms(statefile.read(str(tmp_path)), StatusDoc, "doc")
    assert json.loads((tmp_path / statefile.FILE).read_text())["deployments"][0] == json.loads(json.dumps(one))
    status._print_status(statefile.read(str(tmp_path)))  # and `status` shows every part of it
    out = capsys.readouterr().out
    assert "serve log: vLLM 0.15.1, KV cache 409856 tokens" in out and "rank on spark-3: no container" in out


def test_the_conformance_check_finds_a_wrong_type_and_a_stray_key() -> None:
    doc = full_document()
    bad = json.loads(json.dumps(doc))
    bad["deployments"][0]["nodes"]["spark-1"]["memory"]["free_mib"] = "10"
    bad["ray"]["fraction"] = 1
    assert set(conforms(bad, StatusDoc, "doc")) == {"doc.deployments[0].nodes.spark-1.memory.free_mib: '10' is not a int",
                                                    "doc.ray: 'fraction' is not a key of RayDoc"}


def test_status_says_which_serve_paths_ran_for_real_and_which_only_on_the_stand_in(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ray's executor never runs on vLLM's CPU build, so the suite proves it on the stand-in only; mp runs the
    real server on one node and two (tests/integration/test_real_vllm.py, test_real_mp.py)."""
    from tests.helpers import data
    ray = statusdoc.document(Status(phase=Phase.SERVING), None, view_of(cfg()), "/etc/x.toml", "abc", time.time(), 0.0)
    d = data()
    d["deployments"][0]["serve"]["distributed_executor_backend"] = "mp"
    mp = statusdoc.document(Status(phase=Phase.SERVING), None, view_of(cfg(d)), "/etc/x.toml", "abc", time.time(), 0.0)
    assert ray["deployment"]["backend"]["name"] == "ray" and "stand-in only" in ray["deployment"]["backend"]["evidence"]
    assert mp["deployment"]["backend"] == {"name": "mp", "nodes": 2, "evidence": statusdoc.EVIDENCE["mp"]}
    assert "real vLLM server" in statusdoc.EVIDENCE["mp"]
    status._print_deployment(mp)
    assert "backend: mp across 2 nodes: proven on the real vLLM server" in capsys.readouterr().out


def test_a_memory_figure_the_node_did_not_report_is_shown_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    """meminfo without MemFree and Cached: the document says null (MemoryDoc: int | None), which `status` once
    showed as "None" (its "?" was for a missing key only)."""
    c = cfg()
    nodes = {n.name: node_obs(n.name, memory=Memory(122880, 118000)) for n in c.nodes}
    d = statusdoc.document(Status(), Observation(1.0, True, nodes), view_of(c), "/etc/x.toml", "abc", time.time(), 0.0)
    assert d["nodes"]["spark-1"]["memory"] == {"total_mib": 122880, "available_mib": 118000, "free_mib": None,
                                               "cached_mib": None}
    status._print_node("spark-1", d["nodes"]["spark-1"])
    assert "memory MiB: free ?, cached ?, available 118000 of 122880," in capsys.readouterr().out


def test_the_status_file_is_news_when_the_users_requests_change_not_when_the_engines_times_move() -> None:
    """reporting._change_key: a request running or waiting more or less is written at once (what the users do
    shows in `status` within a tick); the times that move every tick wait for the refresh."""
    from spark_supervisor.loop.reporting import _change_key

    def with_engine(**kw: Any) -> Any:
        doc = copy.deepcopy(full_document())
        e: Any = {"read": True, "running": 0, "waiting": 0, "still_s": 0.0, "stalled_s": 0.0, "error": "", **kw}
        for d in (doc, *doc["deployments"]):
            d["liveness"]["engine"] = e
        return _change_key(doc)

    idle = with_engine()
    assert with_engine(still_s=3.0) == idle
    assert with_engine(running=2, still_s=0.5) != idle != with_engine(waiting=1)
    assert with_engine(running=2, still_s=0.5) == with_engine(running=2, still_s=4.5)
    assert with_engine(stalled_s=21.0) != idle
    assert with_engine(read=False, error="ConnectError") != idle  # the engine no longer read: unknown, news


def test_a_probes_failures_in_a_row_are_news_its_successes_are_counted_at_the_refresh() -> None:
    from spark_supervisor.loop.reporting import _change_key

    def with_health(**kw: Any) -> Any:
        doc = copy.deepcopy(full_document())
        for d in (doc, *doc["deployments"]):
            health: Any = d["liveness"]["health"]
            health.update(kw)
        return _change_key(doc)

    base = with_health(failures=0, successes=10, last="success")
    assert with_health(failures=0, successes=11, last="success") == base
    assert with_health(failures=1, successes=10, last="success") != base


def test_a_facts_fields_are_kept_between_documents_and_each_document_gets_its_own_top_level() -> None:
    """The same facts come back every tick: their fields are made once (asdict's deep copies were a fifth of the
    idle CPU with the stack), equal facts share them, and a change to one document's copy reaches no other."""
    import dataclasses

    from spark_supervisor.model import Gpu, GpuProcess, ImageReport, ModelReport
    from spark_supervisor.report import statusdoc
    statusdoc._fields.cache_clear()
    image = ImageReport("spark-1", "img", "k", ray_version="2.60.0", model=ModelReport("spark-1", "m", "k", files=3))
    a, b = statusdoc.as_dict(image), statusdoc.as_dict(dataclasses.replace(image))  # equal, not the same object
    assert a == b == dataclasses.asdict(image) and a is not b
    assert statusdoc._fields.cache_info().hits == 1
    a["ray_version"] = "changed"
    assert statusdoc.as_dict(image)["ray_version"] == "2.60.0"
    gpu = Gpu("GB10", processes=[GpuProcess(1, "x", 10)])  # type: ignore[arg-type]  # a list: not hashable
    assert statusdoc.as_dict(gpu) == dataclasses.asdict(gpu)
