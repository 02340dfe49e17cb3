"""manifests/grafana/elastic-dashboard.json: valid JSON, every metric it queries is one the controller exports,
and every label it reads is on those series as Prometheus scrapes them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from elastic.controller.metrics_export import ControllerMetrics
from elastic.policy.budget import Budget
from elastic.rendezvous.state import JobState, Round

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


def scraped_labels() -> dict[str, set[str]]:
    """Each series name of a scrape, after the controller recorded one job, with its label names, read back
    through prometheus_client's own exposition parser (what Prometheus reads)."""
    metrics = ControllerMetrics()
    state = JobState(run_id="run-1", round=Round(0), budget=Budget(max=3))
    metrics.record("team-a", "train", "run-1", state, {"phase": "Running", "restarts": {"used": 0, "max": 3}})
    text = generate_latest(metrics.registry).decode()
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def queries(dashboard: dict) -> list[str]:
    """Every PromQL text of the dashboard: panel targets with their legends, and template variables."""
    texts = [f"{t['expr']} {t.get('legendFormat', '')}" for p in dashboard["panels"] for t in p["targets"]]
    return texts + [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]


def label_names(query: str) -> set[str]:
    """Label names a query reads: in selectors `{a=~"..."}`, `by (a, b)`, `label_values(m, a)`, legends `{{a}}`."""
    names = {name for selector in re.findall(r"\{([^{}]*)\}", query.replace("{{", "<").replace("}}", ">"))
             for name in re.findall(r"([a-z_]+)\s*[=!]~?", selector)}  # fmt: skip
    names |= {n.strip() for group in re.findall(r"by \(([^)]*)\)", query) for n in group.split(",")}
    names |= set(re.findall(r"label_values\([^,]+,\s*([a-z_]+)\)", query))
    names |= set(re.findall(r"\{\{([a-z_]+)\}\}", query))
    return names - {"le"}  # a histogram's bucket bound, on the _bucket series


def test_the_dashboards_labels_are_on_the_series_it_queries_after_a_default_scrape() -> None:
    scraped = scraped_labels()
    assert not {"job", "namespace"} & set().union(*scraped.values()), "Prometheus' own target labels: renamed"
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for query in queries(dashboard):
        metrics = set(re.findall(r"\belastic_[a-z_]+", query))
        wanted = label_names(query)
        for name in metrics:
            assert name in scraped, f"{name} has no series after a job was recorded ({query})"
            assert wanted <= scraped[name] | {"le"}, f"{query}: {sorted(wanted - scraped[name])} not on {name}"


def test_a_jobs_counters_exist_at_zero_from_its_start() -> None:
    scraped = scraped_labels()
    assert "elastic_rounds_total" in scraped and "elastic_restarts_charged_total" in scraped, sorted(scraped)
