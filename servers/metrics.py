"""Per-server Prometheus metrics (own registry, so several servers can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.in_flight = Gauge(
            "agentloop_requests_in_flight", "Generate requests running now", registry=self.registry
        )
        self.requests = Counter(
            "agentloop_requests",
            "Finished generate requests by finish reason",
            ["finish_reason"],
            registry=self.registry,
        )
        self.errors = Counter(
            "agentloop_request_errors",
            "Generate requests that failed, by kind",
            ["kind"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "agentloop_http_rejected",
            "HTTP requests turned away before running: 'overloaded' (503, over "
            "max_concurrent_requests), 'over_limit' (400, over max_n, max_tokens_per_request "
            "or max_prompt_tokens) or 'unauthorized' (401, missing or wrong bearer token)",
            ["reason"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "agentloop_prompt_tokens", "Prompt tokens received", registry=self.registry
        )
        self.generated_tokens = Counter(
            "agentloop_generated_tokens", "Tokens generated", registry=self.registry
        )
        self.latency = Histogram(
            "agentloop_request_latency_seconds",
            "Generate request latency",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def text(self) -> bytes:
        """Prometheus exposition format."""
        return generate_latest(self.registry)
