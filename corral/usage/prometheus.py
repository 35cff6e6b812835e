"""A minimal client of Prometheus' HTTP API (stdlib only): instant queries."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or refused a query; the message says which and why."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


class Prometheus:
    def __init__(self, url: str, timeout: float = 60.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"--prometheus {url!r} is not an http(s) URL like http://127.0.0.1:9090")
        if parsed.username or parsed.password:
            # A URL ends up in error messages and shell history.
            raise PrometheusError("--prometheus must not carry credentials")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query(self, expr: str, at: float) -> list[Sample]:
        """An instant vector query evaluated at `at` (Unix seconds)."""
        body = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/query", data=body, method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:
            try:
                answer = json.load(error)
            except ValueError:
                raise PrometheusError(f"{self.url} answered HTTP {error.code} to a query") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise PrometheusError(
                f"cannot reach Prometheus at {self.url} ({reason}); from outside the cluster: "
                "kubectl -n corral-monitoring port-forward svc/prometheus 9090"
            ) from None
        except ValueError:
            raise PrometheusError(f"{self.url} did not answer with Prometheus' JSON: is it a Prometheus?") from None
        if answer.get("status") != "success":
            raise PrometheusError(f"Prometheus refused the query {expr!r}: {answer.get('error', answer)}")
        data = answer["data"]
        if data["resultType"] != "vector":
            raise PrometheusError(f"the query {expr!r} returned a {data['resultType']}, not a vector")
        return [Sample(item["metric"], float(item["value"][1])) for item in data["result"]]
