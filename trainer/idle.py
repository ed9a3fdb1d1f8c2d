"""Whether serving is idle: the engines' own gauges of requests running and waiting (vLLM's
`/metrics`). A round's training runs past its time budget, up to a ceiling, only while every
engine of its task's model has none (`methods.Budget`), so the steps it takes follow what the
machine has to spare, and serving comes first."""
from __future__ import annotations

import httpx

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
PROBE_TIMEOUT_S = 2.0


def requests_in_engine(metrics_text: str) -> float:
    """Requests running and waiting, summed over every sample of the two gauges in a /metrics page."""
    total = 0.0
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in GAUGES:
            total += float(line.rsplit(" ", 1)[1])
    return total


def load_of(response: httpx.Response) -> float | None:
    """Requests running and waiting from an engine's /metrics response; None where it is not a page
    with the gauges (an error status, or an engine that does not report them)."""
    text = response.text if response.status_code == 200 else ""
    if not any(line.startswith(GAUGES) for line in text.splitlines()):
        return None
    return requests_in_engine(text)


def engines_idle(urls: list[str]) -> bool:
    """True when every engine answers its /metrics with no request running or waiting; an engine
    that does not answer, or a page without the gauges, counts as busy (never train on a guess)."""
    if not urls:
        return False
    for url in urls:
        try:
            load = load_of(httpx.get(f"{url.rstrip('/')}/metrics", timeout=PROBE_TIMEOUT_S))
        except httpx.HTTPError:
            return False
        if load is None or load > 0:
            return False
    return True
