"""Prometheus metrics of the gateway (exposed at /metrics).

Counted here per request: requests, latency, reward, errors, the gateway's own time. Read at
scrape time (`StateCollector`): engine health as this gateway sees it, whether Redis answers, and
the rounds' outcomes and durations from the counters each round adds to in Redis as it is saved
(rounds run in the trainer's process, so no gateway counts them as they happen).

With several gateway workers, `deploy.serve` sets PROMETHEUS_MULTIPROC_DIR before they start:
each worker's prometheus_client then keeps its values in files there, and /metrics sums every
worker's, so a scrape that reaches one worker still counts all of them."""
import os

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

REGISTRY = CollectorRegistry()
REQUESTS = Counter("tucano_requests_total", "Answered requests", ["task", "version", "status"], registry=REGISTRY)
LATENCY = Histogram("tucano_request_latency_seconds", "End-to-end latency", ["task", "version"], registry=REGISTRY,
                    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
ENGINE_ERRORS = Counter("tucano_engine_errors_total", "Engine call failures", ["engine_kind"], registry=REGISTRY)
REWARD = Histogram("tucano_reward", "Reward total of answers", ["task", "version"], registry=REGISTRY,
                   buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0))
ERROR_RESPONSES = Counter("tucano_error_responses_total", "Error responses, by status and error type (the access log is "
                          "off by default, so these are where refused requests show)", ["status", "type"], registry=REGISTRY)
RECORD_FAILURES = Counter("tucano_record_write_failures_total", "Records Redis did not take", registry=REGISTRY)
GATEWAY_OVERHEAD = Histogram(
    "tucano_gateway_overhead_seconds", "Time an answered (non-streamed) request spent in the gateway outside its "
    "wait for the engine's answer: routing, validation, prompt, scoring, record write, response (an answer that "
    "waits for the event loop counts as engine time)", ["task"], registry=REGISTRY,
    buckets=(0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01,
             0.025, 0.05, 0.1, 0.25, 1))


def exposed() -> CollectorRegistry:
    """What /metrics shows: this process's registry, or every worker's files summed."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    summed = CollectorRegistry()
    multiprocess.MultiProcessCollector(summed)
    return summed


class StateCollector:
    """Gauges and counters read from the gateway's state when /metrics is scraped: one HGETALL of
    the rounds' totals, which each round adds to as it is saved (`Store.save_round`)."""

    def __init__(self, pools: dict, store):
        self.pools, self.store = pools, store

    def collect(self):
        engines = GaugeMetricFamily("tucano_engine_up", "1 when the gateway's last probe of the engine succeeded", labels=["kind", "url"])
        for kind, pool in self.pools.items():
            for engine in pool.engines:
                engines.add_metric([kind, engine.url], 1.0 if engine.healthy else 0.0)
        yield engines
        try:
            totals = self.store.round_totals()
            store_up = 1.0
        except redis.RedisError:  # a store that does not answer is what tucano_store_up reports
            totals, store_up = {}, 0.0
        yield GaugeMetricFamily("tucano_store_up", "1 when Redis answered this scrape", value=store_up)
        decisions = CounterMetricFamily("tucano_round_decisions", "Per task, what the rounds decided (promoted, rejected, "
                                        "not trained, failed, ...)", labels=["task", "outcome"])
        for name, count in sorted(totals.items()):
            if name.startswith("decision:"):
                _, task, outcome = name.split(":", 2)
                decisions.add_metric([task, outcome], count)
        yield decisions
        durations = CounterMetricFamily("tucano_round_duration_seconds", "Seconds the rounds took, summed")
        durations.add_metric([], totals.get("seconds", 0.0))
        yield durations
        completed = CounterMetricFamily("tucano_rounds", "Rounds run")
        completed.add_metric([], totals.get("rounds", 0.0))
        yield completed
        # declared with no sample before the first round, so a query names the series either way
        last_seconds = GaugeMetricFamily("tucano_round_last_duration_seconds", "Seconds the newest round took")
        last_started = GaugeMetricFamily("tucano_round_last_started_timestamp_seconds", "When the newest round started")
        if "last_seconds" in totals:
            last_seconds.add_metric([], totals["last_seconds"])
            last_started.add_metric([], totals["last_started"])
        yield last_seconds
        yield last_started


def state_registry(pools: dict, store) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(pools, store))
    return registry
