"""vLLM's OpenAI-compatible API: reachability, served models, and one real request (readiness.probe)."""

from __future__ import annotations

import time

import httpx

from ..model import EndpointObservation, EndpointState, Verdict
from ..probes import judge, sanity_request
from .health import observed


class VllmApi:
    def __init__(self, client: httpx.Client, url: str, *, api_key: str, timeout: float):
        self.http, self.url, self.timeout = client, url.rstrip("/"), timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def observe_health(self) -> EndpointObservation:
        """/health alone (the cheap check). Refused is a load in progress: vLLM listens only once loaded."""
        try:
            code = self.http.get(f"{self.url}/health", timeout=self.timeout).status_code
        except httpx.HTTPError as e:
            return observed(failure=e)
        return observed(code)

    def observe(self) -> EndpointObservation:
        """/health, then the served models."""
        ep = self.observe_health()
        if ep.state != EndpointState.UP:
            return ep
        try:
            r = self.http.get(f"{self.url}/v1/models", headers=self.headers, timeout=self.timeout)
            if r.status_code != 200:
                return EndpointObservation(EndpointState.ERROR, f"/v1/models answered HTTP {r.status_code}", ep.health)
            models = tuple(str(m.get("id")) for m in r.json().get("data", []))
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            return EndpointObservation(EndpointState.ERROR, f"/v1/models: {type(e).__name__}", ep.health)
        return EndpointObservation(EndpointState.UP, "", ep.health, models)

    def sanity(self, model: str, prompt: str, max_tokens: int, timeout: float, serve: str,
               kind: str = "chat") -> Verdict:
        """One real request of the readiness probe's kind: a chat completion, an embedding or a rerank."""
        t0 = time.monotonic()
        path, body = sanity_request(kind, model, prompt, max_tokens)
        try:
            r = self.http.post(f"{self.url}{path}", headers=self.headers, timeout=timeout, json=body)
        except httpx.ConnectTimeout:
            return Verdict(False, "could not connect", serve, ran=False)
        except httpx.TimeoutException:
            return Verdict(False, f"no answer within {timeout:.0f}s", serve, round(time.monotonic() - t0, 3))
        except httpx.HTTPError as e:
            return Verdict(False, f"{type(e).__name__}: {e}"[:200], serve, ran=False)
        return judge(kind, r.status_code, r.content, serve=serve, latency_s=time.monotonic() - t0)
