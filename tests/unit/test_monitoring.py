"""What monitoring/ ships: the alert rules pass `promtool check rules` and their own `promtool test rules`, and
every metric the rules and the Grafana dashboard query is one the daemon really exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_supervisor.adapters import UNEXPECTED
from spark_supervisor.model import (
    Gid,
    HostFacts,
    Link,
    PerfVerdict,
    Phase,
    RdmaPort,
    Reason,
    Status,
    Transport,
    Verdict,
)
from spark_supervisor.report.metrics import Metrics
from tests.helpers import cfg, obs, view_of

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
RULES = MONITORING / "prometheus-rules.yml"
RULE_TESTS = MONITORING / "prometheus-rules.test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
# Prometheus' own series for each scrape target, not the daemon's: the daemon-down rule and panel read it.
SCRAPE_SERIES = {"up"}
# Grafana's variables, as Prometheus would see them once Grafana has filled them in.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$deployment": ".*"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """`make test` and `make unit` fetch promtool into the venv (the Makefile's promtool target): missing, this
    fails rather than skips, so the rules are never shipped unchecked."""
    beside = Path(sys.executable).parent / "promtool"
    exe = str(beside) if beside.exists() else shutil.which("promtool")
    if exe is None:
        pytest.fail(f"promtool is neither at {beside} nor on PATH: run `make promtool`")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=MONITORING)


# ------------------------------------------------------------------------------------------ the rules
def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_rules_pass_promtool_check() -> None:
    r = promtool("check", "rules", RULES.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules())} rules found" in r.stdout


def test_rules_pass_their_promtool_unit_tests() -> None:
    r = promtool("test", "rules", RULE_TESTS.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    """Each alert has a case where it fires and one where it must not: a rule that fires on everything (or on
    nothing) fails its tests."""
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    for rule in rules():
        name = rule["alert"]
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no test where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no test where it stays quiet"


def test_rules_cover_the_issue_and_say_what_and_where() -> None:
    by_name = {r["alert"]: r for r in rules()}
    for name in ("SparkSupervisorFailed", "SparkSupervisorRepairBudgetLow", "SparkSupervisorLoadStalled",
                 "SparkSupervisorNodeLost", "SparkSupervisorDown"):
        assert name in by_name
    for name, r in by_name.items():
        assert r["labels"]["severity"] in ("critical", "warning", "info"), name
        assert r["annotations"]["summary"] and r["annotations"]["description"], name
        process_wide = ("state_write_errors", "probe_unexpected_errors")
        if "spark_supervisor_" in r["expr"] and not any(m in r["expr"] for m in process_wide):  # per deployment
            assert "$labels.deployment" in r["annotations"]["summary"], name
    assert "$labels.node" in by_name["SparkSupervisorNodeLost"]["annotations"]["summary"]
    # Below vLLM: the fabric, the GPU, a peer's reboot.
    for name in ("SparkFabricLinkDown", "SparkFabricMtuMismatch", "SparkGidIndexMoved", "SparkFabricFallback",
                 "SparkFabricDegraded", "SparkGpuAccessLost", "SparkPeerRebooted"):
        assert name in by_name
    for name in ("SparkFabricLinkDown", "SparkGpuAccessLost"):
        assert "$labels.node" in by_name[name]["annotations"]["summary"], name


# ------------------------------------------------------------------------- metric names in the queries
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.:$])([a-zA-Z_:][\w:]*)(?!\s*\(|[\w:])")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan", "atan2"}


def grafana_to_promql(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what remains once strings, label matchers, ranges,
    grouping label lists, functions and keywords are taken out."""
    expr = _STRING.sub('""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = _GROUPING.sub(" ", expr)
    return {m for m in _IDENT.findall(expr) if m.lower() not in _KEYWORDS}


def test_metric_names_are_read_from_promql() -> None:
    expr = ('sum by (deployment, kind) (increase(spark_supervisor_repairs_total{deployment=~"a|b",x!="up"}[5m]))'
            ' / on(deployment) group_left(phase) (spark_supervisor_repair_budget > 0) and bool up offset 5m'
            ' or absent(foo:bar_ratio) * 0.8e3 unless label_replace(other, "dst", "$1", "src", "(.*)")')
    assert metric_names(expr) == {"spark_supervisor_repairs_total", "spark_supervisor_repair_budget", "up",
                                  "foo:bar_ratio", "other"}


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return found


def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in items:
        out.append(p)
        out += panels(p.get("panels", []))  # a collapsed row holds its panels
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    d = dashboard()
    out = [(p["title"], grafana_to_promql(t["expr"])) for p in panels(d["panels"]) for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)  # Grafana's, not PromQL: its selector is
            out.append((f"variable {v['name']}", m.group(1) if m else q))
    return out


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every sample name a real Metrics serves once each of its calls has run: counters as name_total,
    the info metric as name_info, as Prometheus scrapes them."""
    m = Metrics("127.0.0.1", 0)
    try:
        c = cfg()
        st = Status()
        st.advance(Phase.LOADING, Reason("LoadingModel"), 10.0, 1.0)
        st.load_fraction, st.eta_s, st.load_progress_at = 0.4, 300.0, 20.0
        st.unknown_since = {"ray dashboard": 30.0}
        st.hosts = {n.name: HostFacts("boot", "machine", (Link(n.fabric_interface, "up", mtu, 200_000),),
                                      (RdmaPort("rocep1s0f1", 1, "ACTIVE", 200.0, "28.45", (
                                          Gid(3, "g", n.fabric_ip, "RoCE v2", n.fabric_interface),)),))
                    for n, mtu in zip(c.nodes, (9000, 1500), strict=True)}  # unequal MTUs: a fabric problem
        st.gpu_lost = {"spark-2": "Unknown Error"}
        st.transports = (Transport(0, c.nodes[0].fabric_ip, "IB"),)
        q = m.bound("qwen")
        q.update(st, obs(c, deployed=True), 70.0, view_of(c))
        q.repaired("gang", "RayNodeLost")
        q.probed("deep", "success", Verdict(True, "ok", latency_s=0.5))
        q.unknown("ray dashboard")
        q.page_cache_dropped("spark-1")
        q.kv_cache(100_000, 120_000, True)
        q.ready_after(300.0)
        q.alerted("failed", "webhook", False)
        q.change_refused()
        q.performance(PerfVerdict("s", 1.0, 0.2, 27.4, 80.0, 27.9, "best"))
        m.state_write_failed("status")
        UNEXPECTED["listening"] += 1  # as adapters.guarded counts one
        families = list(m.registry.collect())
    finally:
        m.close()
        UNEXPECTED.clear()
    empty = [f.name for f in families if not f.samples]
    assert not empty, f"drive these metrics above too, so the queries can be checked against them: {empty}"
    return {s.name for f in families for s in f.samples}


def test_rules_name_only_metrics_the_daemon_exports(exported: set[str]) -> None:
    """The expressions, and the queries in annotation templates ({{ with printf "..." | query }})."""
    for r in rules():
        queries = [r["expr"]] + [q.replace("%q", '""') for text in r["annotations"].values()
                                 for q in re.findall(r'printf "((?:[^"\\]|\\.)*)"', text)]
        for q in queries:
            names = metric_names(q.replace('\\"', '"'))
            assert names, f"{r['alert']}: no metric in {q!r}"
            assert names <= exported | SCRAPE_SERIES, f"{r['alert']}: not exported: {names - exported - SCRAPE_SERIES}"


def test_dashboard_names_only_metrics_the_daemon_exports(exported: set[str]) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    used: set[str] = set()
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= exported | SCRAPE_SERIES, f"{where}: not exported: {names - exported - SCRAPE_SERIES}"
        used |= names
    # The dashboard shows the daemon's every metric (the _created timestamps aside).
    assert {n for n in exported if not n.endswith("_created")} <= used


def test_dashboard_queries_are_promql(tmp_path: Path) -> None:
    """promtool parses each query (Grafana's variables filled in) as a recording rule."""
    records = [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(dashboard_queries())]
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    r = promtool("check", "rules", str(f))
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_imports_with_a_datasource_input() -> None:
    d = dashboard()
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"]
    for p in panels(d["panels"]):
        for owner in [p, *p.get("targets", [])]:
            if "datasource" in owner:
                assert owner["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
    ids = [p["id"] for p in panels(d["panels"])]
    assert len(ids) == len(set(ids))


def test_dashboard_phase_history_names_every_phase() -> None:
    """The phase timeline colours a code per phase: a phase added to model.Phase must be added there."""
    history = next(p for p in panels(dashboard()["panels"]) if p["title"] == "Phase history")
    texts = {o["text"] for m in history["fieldConfig"]["defaults"]["mappings"] for o in m["options"].values()}
    assert texts == {p.value for p in Phase}
    expr = history["targets"][0]["expr"]
    assert {p.value for p in Phase} == set(re.findall(r'phase="(\w+)"', expr))

