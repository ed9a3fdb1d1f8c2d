"""The Grafana dashboard and the Prometheus scrape config under deploy/ parse, and every series
a panel queries is one the gateway's /metrics exposes (here: the families a gateway declares
with nothing counted yet; the integration tier checks a live /metrics after traffic)."""
from __future__ import annotations

import json
import re

import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO
from tests.unit.test_access import app_for

DASHBOARD = REPO / "deploy" / "grafana" / "tucano.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "summary": ("", "_sum", "_count")}


def queried_series() -> dict[str, set[str]]:
    """Panel title -> the tucano_* series its queries name."""
    board = json.loads(DASHBOARD.read_text())
    return {panel["title"]: {name for target in panel["targets"] for name in re.findall(r"\btucano_[a-z_]+\b", target["expr"])}
            for panel in board["panels"]}


def exposed_series(metrics_text: str) -> set[str]:
    return {family.name + suffix for family in text_string_to_metric_families(metrics_text) for suffix in SUFFIXES.get(family.type, ("",))}


def missing_series(metrics_text: str) -> dict[str, set[str]]:
    exposed = exposed_series(metrics_text)
    return {title: names - exposed for title, names in queried_series().items() if names - exposed}


def test_every_panel_queries_series_the_gateway_exposes():
    with TestClient(app_for(None, None)) as client:
        text = client.get("/metrics").text
    assert not missing_series(text)
    queried = set().union(*queried_series().values())
    # what the issue asks the board to cover: requests, latency, errors, reward, engine health, rounds
    for needed in ("tucano_requests_total", "tucano_request_latency_seconds_bucket", "tucano_error_responses_total",
                   "tucano_reward_sum", "tucano_engine_up", "tucano_round_decisions_total", "tucano_round_last_duration_seconds"):
        assert needed in queried, needed


def test_a_misnamed_series_is_caught():
    assert missing_series("# TYPE tucano_requests counter\n") != {}


def test_the_board_and_the_scrape_config_parse_into_what_grafana_and_prometheus_read():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and len({panel["id"] for panel in board["panels"]}) == len(board["panels"])
    assert all(panel["targets"] and all(t["expr"].strip() for t in panel["targets"]) for panel in board["panels"])
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert jobs["tucano-gateway"]["metrics_path"] == "/metrics" and jobs["tucano-gateway"]["static_configs"][0]["targets"]
    for path in ("dashboards/tucano.yml", "datasources/prometheus.yml"):
        assert yaml.safe_load((REPO / "deploy" / "grafana" / "provisioning" / path).read_text())["apiVersion"] == 1
