"""The shipped alerting rules and Grafana dashboard against Prometheus's own promtool: the rules file
is valid, each alert fires on the series it is about (and stays quiet otherwise, e.g. a backend still
loading during a switch), and every dashboard query is valid PromQL."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "contrib" / "prometheus" / "gpushift-alerts.yml"
DASHBOARD = REPO / "contrib" / "grafana" / "gpushift-dashboard.json"
HOST = {"instance": "gpu1:9840", "job": "gpushift"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not installed: make deps (apt-get install --no-install-recommends prometheus)",
            pytrace=False,
        )
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=60)


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in {**labels, **HOST}.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def alert(labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {
        "exp_labels": {**labels, **HOST},
        "exp_annotations": {"summary": summary, "description": description},
    }


def test_alert_rules_file_is_valid() -> None:
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 7 rules found" in r.stdout


def test_alert_rules_fire_on_what_they_are_about(tmp_path: Path) -> None:
    failed = {"from": "day", "to": "night", "trigger": "schedule", "outcome": "failed"}
    ok = {**failed, "outcome": "ok"}
    backend_summary = "gpushift backend night is active but not healthy"
    backend_desc = (
        "Its unit runs and its health URL has not answered OK for 5 minutes; after unhealthy_after_s "
        'gpushift relaunches it (on_crash = "restart").'
    )
    switch_failed = alert(
        {**failed, "severity": "critical"},
        "gpushift switch from day to night failed",
        "Trigger schedule. `gpushift ledger --outcome failed` says why.",
    )
    tests = [
        {  # the first failure creates its counter series at 1; a second one 30 minutes later
            "interval": "1m",
            "input_series": [
                series("gpushift_switches_total", "_x5 1x25 2x10", **failed),
                series("gpushift_switches_total", "1x40", **ok),
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "GpushiftSwitchFailed", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "GpushiftSwitchFailed", "exp_alerts": [switch_failed]},
                {"eval_time": "25m", "alertname": "GpushiftSwitchFailed", "exp_alerts": []},
                {"eval_time": "32m", "alertname": "GpushiftSwitchFailed", "exp_alerts": [switch_failed]},
            ],
        },
        {  # the daemon stops answering at 10m; the foreign holder appears at 2m
            "interval": "1m",
            "input_series": [
                {"series": 'up{instance="gpu1:9840",job="gpushift"}', "values": "1x10 0x10"},
                series("gpushift_vram_held_by_foreign_process", "0 0 1x20", gpu="0", uuid="GPU-1"),
            ],
            "alert_rule_test": [
                {"eval_time": "11m", "alertname": "GpushiftDaemonDown", "exp_alerts": []},
                {
                    "eval_time": "13m",
                    "alertname": "GpushiftDaemonDown",
                    "exp_alerts": [
                        alert(
                            {"severity": "critical"},
                            "gpushift on gpu1:9840 does not answer /metrics",
                            "Scrapes have failed for 2 minutes: `systemctl status gpushift`.",
                        )
                    ],
                },
                {
                    "eval_time": "8m",
                    "alertname": "GpushiftVramHeldByForeignProcess",
                    "exp_alerts": [
                        alert(
                            {"severity": "warning", "gpu": "0", "uuid": "GPU-1"},
                            "GPU 0 on gpu1:9840: VRAM held outside the backends",
                            "`gpushift status` names the process; a switch onto this GPU is refused until it exits.",
                        )
                    ],
                },
                {"eval_time": "20m", "alertname": "GpushiftMetricsAbsent", "exp_alerts": []},
            ],
        },
        {  # night's unit is active but unhealthy: first while a switch loads it (quiet), then after
            "interval": "1m",
            "input_series": [
                series("gpushift_backend_unit_active", "1x30", backend="night"),
                series("gpushift_backend_up", "0x30", backend="night"),
                series("gpushift_switch_in_progress", "1x10 0x20"),
                series("gpushift_ledger_degraded", "0x5 1x20"),
            ],
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": "GpushiftBackendNotUp", "exp_alerts": []},
                {
                    "eval_time": "17m",
                    "alertname": "GpushiftBackendNotUp",
                    "exp_alerts": [
                        alert({"severity": "critical", "backend": "night"}, backend_summary, backend_desc)
                    ],
                },
                {
                    "eval_time": "12m",
                    "alertname": "GpushiftLedgerDegraded",
                    "exp_alerts": [
                        alert(
                            {"severity": "warning"},
                            "gpushift ledger on gpu1:9840 is degraded",
                            "`gpushift status` says why (disk full, locked); records wait in the spool.",
                        )
                    ],
                },
            ],
        },
        {  # no gpushift target at all
            "interval": "1m",
            "input_series": [{"series": 'up{instance="other:9100",job="node"}', "values": "1x20"}],
            "alert_rule_test": [
                {
                    "eval_time": "15m",
                    "alertname": "GpushiftMetricsAbsent",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "job": "gpushift"},
                            "exp_annotations": {
                                "summary": "No gpushift target is scraped",
                                "description": "Prometheus has no `up` series for job gpushift.",
                            },
                        }
                    ],
                }
            ],
        },
    ]
    spec = tmp_path / "gpushift-alerts.test.yml"
    spec.write_text(json.dumps({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    r = promtool("test", "rules", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    # Each panel query as a recording rule (Grafana's variables given values): promtool parses them.
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    rules = [
        {
            "record": f"gpushift:dashboard_query_{i}",
            "expr": e.replace("$instance", ".*").replace("$__range", "1h"),
        }
        for i, e in enumerate(exprs)
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = promtool("check", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
