"""A real Prometheus (Debian's `prometheus` package) over synthetic data.

The fixture backfills the synthetic series (synthetic.py) with `promtool tsdb
create-blocks-from openmetrics`, starts its own `prometheus` on a free
loopback port over a temporary TSDB, then backfills the monitoring add-on's
recording rules with `promtool tsdb create-blocks-from rules` - layer by
layer, since that command cannot use a rule's output in the same run - and
restarts Prometheus so it serves the recorded series too. The system's own
prometheus service (the package starts one on systemd machines) is not used.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from corral.manifests import monitoring

from . import synthetic

NEEDS_PROMETHEUS = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="prometheus/promtool not installed (apt-get install prometheus; scripts/install --test does)",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def recording_rule_layers(groups: list[dict]) -> list[list[dict]]:
    """Recording rules in layers: each layer reads only raw series and earlier layers' records."""
    rules = [r for g in groups for r in g["rules"] if "record" in r]
    names = {r["record"] for r in rules}

    def reads(rule: dict) -> set[str]:
        return {n for n in names if re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", rule["expr"])}

    layers, done = [], set()
    while len(done) < len(names):
        layer = [r for r in rules if r["record"] not in done and reads(r) <= done]
        assert layer, "recording rules depend on each other in a cycle"
        layers.append(layer)
        done |= {r["record"] for r in layer}
    return layers


class PrometheusProcess:
    def __init__(self, root: Path, config: str = "global: {scrape_interval: 1m}\n") -> None:
        self.root = root
        self.tsdb = root / "tsdb"
        self.config = root / "prometheus.yml"
        self.config.write_text(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = root / "prometheus.log"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={self.config}", f"--storage.tsdb.path={self.tsdb}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=10y",
                 # A live scrape ends a vanished series (a GPU's pod label when
                 # the pod ends) with a staleness marker; backfilled blocks
                 # have none, so without this a series would count for the
                 # default 5 minutes after its last sample.
                 f"--query.lookback-delta={synthetic.STEP}s"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready in 60 s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def promtool(*args: str, cwd: Path) -> str:
    result = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="package")
def prometheus(tmp_path_factory):
    """The URL of a running Prometheus with the synthetic data and the recorded series."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("prometheus/promtool not installed (apt-get install prometheus; scripts/install --test does)")
    root = tmp_path_factory.mktemp("prometheus")
    (root / "data.om").write_text(synthetic.openmetrics())
    server = PrometheusProcess(root)
    promtool("tsdb", "create-blocks-from", "openmetrics", "--quiet", "--max-block-duration=24h", "data.om",
             str(server.tsdb), cwd=root)
    groups = monitoring.shard_rule_groups(gpu=True) + monitoring.global_rule_groups(gpu=True)
    try:
        server.start()
        for number, layer in enumerate(recording_rule_layers(groups)):
            rules = root / f"layer-{number}.yml"
            rules.write_text(yaml.safe_dump({"groups": [{"name": f"layer-{number}", "rules": layer}]}))
            out = root / f"layer-{number}-blocks"
            promtool("tsdb", "create-blocks-from", "rules", "--quiet", f"--url={server.url}",
                     f"--start={synthetic.START}", f"--end={synthetic.END}",
                     f"--eval-interval={monitoring.RULE_INTERVAL_SECONDS}s", f"--output-dir={out}", rules.name,
                     cwd=root)
            server.stop()
            for block in out.iterdir():
                block.rename(server.tsdb / block.name)
            server.start()
        yield server.url
    finally:
        server.stop()
