"""manifests/grafana/elastic-dashboard.json: valid JSON, and every metric it queries is one the controller exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from elastic.controller.metrics_export import ControllerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "manifests" / "grafana" / "elastic-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_names() -> set[str]:
    """The series names a scrape can hold (a labelled family shows none before its first sample)."""
    families = ControllerMetrics().registry.collect()
    return {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}


def queried_names(dashboard: dict) -> set[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {name for expr in exprs for name in re.findall(r"\belastic_[a-z_]+", expr)}


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queried = queried_names(dashboard)
    assert queried, "the dashboard queries no elastic_ metric"
    assert queried <= exported_names(), f"not exported: {sorted(queried - exported_names())}"


def test_panels_have_unique_ids_and_a_datasource() -> None:
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
