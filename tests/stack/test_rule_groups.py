"""The rule groups' dependency order: Prometheus evaluates groups side by side, so a rule that reads a
series another group records reads it one evaluation old. A group may read only itself (rules above
it) and the groups listed before it, and the promtool tests evaluate the groups in that order."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from traceml_otel.stack import render_all

REPO = Path(__file__).resolve().parents[2]
RECORDED = re.compile(r"(?<![\w:])((?:job|run|run_rank):traceml_\w+:\w+)")


def _groups() -> list[dict]:
    files = render_all()
    return [g for path in ("prometheus/recording.yml", "prometheus/alerts.yml")
            for g in yaml.safe_load(files[path])["groups"]]


def test_every_rule_reads_only_its_group_above_it_or_earlier_groups() -> None:
    groups = _groups()
    where: dict[str, tuple[int, int]] = {}
    for gi, group in enumerate(groups):
        for ri, rule in enumerate(group["rules"]):
            if "record" in rule:
                assert rule["record"] not in where, f"{rule['record']} is recorded twice"
                where[rule["record"]] = (gi, ri)
    read = 0
    for gi, group in enumerate(groups):
        for ri, rule in enumerate(group["rules"]):
            text = rule["expr"] + " ".join((rule.get("annotations") or {}).values())
            for name in RECORDED.findall(text):
                assert name in where, f"{group['name']}: {name} is recorded by no rule"
                read += 1
                assert where[name] < (gi, ri), (
                    f"{group['name']} / {rule.get('record') or rule.get('alert')} reads {name}, "
                    f"recorded by {groups[where[name][0]]['name']}, which is not above it")
    assert read > 100


def test_the_recording_groups_are_split_small() -> None:
    """No recording group goes back to holding most rules (at 1,024 ranks, 42 rules in one group
    took 2.7 s of a 1 s interval on 2 cores): the liveness group is the largest."""
    recording = [g for g in _groups() if g["name"].startswith("traceml-recording")]
    assert len(recording) >= 14
    assert max(len(g["rules"]) for g in recording) <= 17
    per_rank_raw = {g["name"]: sum(1 for r in g["rules"] if r.get("record", "").startswith("run_rank:")
                                   and re.search(r"rate\(traceml_", r["expr"])) for g in recording}
    assert max(per_rank_raw.values()) <= 3, per_rank_raw


def test_promtool_tests_evaluate_the_groups_in_dependency_order() -> None:
    order = [g["name"] for g in _groups()]
    tests = sorted((REPO / "prometheus" / "tests").glob("*.yml"))
    assert len(tests) >= 10
    for path in tests:
        assert yaml.safe_load(path.read_text())["group_eval_order"] == order, path.name
