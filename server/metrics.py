"""Prometheus metrics of the gateway (exposed at /metrics).

With several gateway workers, `deploy.serve` sets PROMETHEUS_MULTIPROC_DIR before they start:
each worker's prometheus_client then keeps its values in files there, and /metrics sums every
worker's, so a scrape that reaches one worker still counts all of them."""
import os

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess

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
    buckets=(0.0005, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1))


def exposed() -> CollectorRegistry:
    """What /metrics shows: this process's registry, or every worker's files summed."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    summed = CollectorRegistry()
    multiprocess.MultiProcessCollector(summed)
    return summed
