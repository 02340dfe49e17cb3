"""Every CEL rule of the CRD has a cost the API server can bound, far under its limits.

kube-apiserver estimates each `x-kubernetes-validations` rule's worst-case cost when the CRD is created and
refuses the CRD when a rule's estimate, times the number of times it may run (the product of the
`maxItems` of every list it sits in), passes 10^7, or all rules together pass 10^8
(StaticEstimatedCostLimit, StaticEstimatedCRDCostLimit). A list or string the rule reads without a bound
is estimated from the 3 MiB request limit: `0 in self.values` on an unbounded list of an unbounded list
of rules is refused at install. This estimate is conservative (higher than the server's): each list or
string a rule reads costs its bound, every rule a fixed 100 on top.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crd.yaml"
RULE_LIMIT = 10_000_000
CRD_LIMIT = 100_000_000
FIXED = 100
SELF_FIELD = re.compile(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)")


def rules(schema: dict[str, Any], path: str = "", runs: float = 1) -> Iterator[tuple[str, str, dict, float]]:
    """(path, rule, node, how many times it may run) for every rule under `schema`."""
    for validation in schema.get("x-kubernetes-validations") or []:
        yield path, validation["rule"], schema, runs
    for name, child in (schema.get("properties") or {}).items():
        yield from rules(child, f"{path}.{name}", runs)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rules(schema["additionalProperties"], f"{path}[*]", runs * schema.get("maxProperties", float("inf")))
    if "items" in schema:
        yield from rules(schema["items"], f"{path}[*]", runs * schema.get("maxItems", float("inf")))


def cost(rule: str, node: dict[str, Any]) -> float:
    """Conservative worst case of one evaluation: what the rule reads of lists and strings, plus a constant."""
    total = FIXED
    for field in set(SELF_FIELD.findall(rule)):
        child = (node.get("properties") or {}).get(field, {})
        if child.get("type") == "array":
            total += child.get("maxItems", float("inf"))
        elif child.get("type") == "string" and "enum" not in child:
            total += child.get("maxLength", float("inf"))
        elif child.get("type") == "object" and "additionalProperties" in child:
            total += child.get("maxProperties", float("inf"))
    return total


def all_rules() -> list[tuple[str, str, float]]:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return [(path, rule, cost(rule, node) * runs) for path, rule, node, runs in rules(schema)]


@pytest.mark.parametrize(("path", "rule", "estimate"), all_rules(), ids=[f"{p}: {r}" for p, r, _ in all_rules()])
def test_each_rule_is_bounded_far_below_the_servers_limit(path: str, rule: str, estimate: float) -> None:
    assert estimate <= RULE_LIMIT / 10, f"{path}: {rule!r} may cost {estimate}: bound the lists it reads or sits in"


def test_all_rules_together_stay_below_the_crd_limit() -> None:
    assert sum(estimate for _, _, estimate in all_rules()) <= CRD_LIMIT / 10


def test_the_estimate_refuses_an_unbounded_list() -> None:
    unbounded = {"type": "array", "items": {"type": "object", "properties": {"values": {"type": "array"}},
                                            "x-kubernetes-validations": [{"rule": "!(0 in self.values)"}]}}  # fmt: skip
    ((_, rule, node, runs),) = list(rules(unbounded))
    assert cost(rule, node) * runs == float("inf")
