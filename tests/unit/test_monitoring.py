"""deploy/monitoring/ (issue 15 item 6): every metric its alerts and dashboard name is one
`vgpuctl watch` exports (its registry, the delegate gauge included), every alert has a runbook
section in docs/runbooks.md, the issue's four alerts are there, and the PodMonitor scrapes the
pods of both installs on the port the probes use."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from reconciler.watch.metrics import WatchMetrics
from tests.kustomize import kustomize
from tests.simnode import REPO

MONITORING = REPO / "deploy" / "monitoring"
RUNBOOKS = REPO / "docs" / "runbooks.md"
_METRIC = re.compile(r"\bvgpuctl_[a-z_]+")


def _one(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((MONITORING / name).read_text())
    assert isinstance(doc, dict)
    return doc


def _exported() -> set[str]:
    names = set()
    for family in WatchMetrics(delegate=True).registry.collect():
        for sample in family.samples:
            names.add(sample.name)
    return names


def _rules() -> list[dict[str, Any]]:
    return [r for g in _one("prometheusrule.yaml")["spec"]["groups"] for r in g["rules"]]


def test_the_alerts_the_issue_names_with_a_runbook_each() -> None:
    rules = _rules()
    assert [r["alert"] for r in rules] == [
        "VgpuctlNotConverged", "VgpuctlBlockedActions", "VgpuctlDesiredStateInvalid",
        "VgpuctlErrors",
    ]  # fmt: skip
    assert next(r for r in rules if r["alert"] == "VgpuctlNotConverged")["for"] == "15m"
    headings = {
        line.removeprefix("## ").strip().lower()
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in rules:
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == rule["alert"].lower()
        assert anchor in headings, f"no runbook section for {rule['alert']}"


def test_every_metric_named_is_one_vgpuctl_exports() -> None:
    exported = _exported()
    exprs = [r["expr"] for r in _rules()]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    named = {m for e in exprs for m in _METRIC.findall(e)}
    assert named, "no metric found"
    assert named - exported == set()
    # Every family vgpuctl exports is looked at somewhere (counters are named with _total,
    # histograms by their _bucket series).
    for family in WatchMetrics(delegate=True).registry.collect():
        assert any(m.startswith(family.name) for m in named), family.name


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(
        p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"]
    )


def test_the_podmonitor_scrapes_both_installs_on_the_probed_port() -> None:
    monitor = _one("podmonitor.yaml")["spec"]
    assert set(monitor["namespaceSelector"]["matchNames"]) == {"vgpuctl-system", "vgpuctl-delegate"}
    (endpoint,) = monitor["podMetricsEndpoints"]
    for path in (
        REPO / "deploy" / "daemonset.yaml",
        REPO / "deploy" / "harvester" / "deployment.yaml",
    ):
        doc = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in monitor["selector"]["matchLabels"].items())
        (expr,) = monitor["selector"]["matchExpressions"]
        assert labels[expr["key"]] in expr["values"]
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        assert endpoint["port"] in [p["name"] for p in container["ports"]]
    kustomization = _one("kustomization.yaml")
    assert sorted(kustomization["resources"]) == ["podmonitor.yaml", "prometheusrule.yaml"]
    assert kustomization["configMapGenerator"][0]["files"] == ["grafana-dashboard.json"]


def test_the_manifests_parse_as_the_operators_kinds() -> None:
    for name, kind in (
        ("prometheusrule.yaml", "PrometheusRule"),
        ("podmonitor.yaml", "PodMonitor"),
    ):
        doc = _one(name)
        assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", kind)
    assert Path(RUNBOOKS).exists()


def test_kustomize_builds_it() -> None:
    built = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in
             kustomize(MONITORING)}  # fmt: skip
    assert built == {
        ("PodMonitor", "vgpuctl", "vgpuctl-system"),
        ("PrometheusRule", "vgpuctl", "vgpuctl-system"),
        ("ConfigMap", "vgpuctl-dashboard", "cattle-dashboards"),
    }
