"""A project folder (Pulumi.yaml, clusters/, stacks/) and the fake CLIs of tests/doctor/fake_bin.

`world` holds what the fakes answer (a healthy account for each example
cluster); a test changes it, then runs one check or the whole command.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from corral.doctor.checks import Context
from corral.doctor.runner import Cli
from corral.model import load_fleet

ROOT = Path(__file__).resolve().parents[2]
FAKE_BIN = Path(__file__).resolve().parent / "fake_bin"
ACCOUNT = "123456789012"
SUBSCRIPTION = "0b6f6c1e-2d3a-4c5b-9e8f-7a6b5c4d3e2f"
STACKS = {
    "heron": "config:\n  aws:region: us-west-2\n  corral:nodeImage: ami-0123456789abcdef0\n"
             "  corral:gpuNodeImage: ami-0fedcba9876543210\n",
    "ibis": "config:\n  gcp:project: corral-ibis\n  gcp:region: us-central1\n"
            "  corral:nodeImage: projects/corral-images/global/images/family/corral-node\n"
            "  corral:gpuNodeImage: projects/corral-images/global/images/corral-gpu-node-k8s-1-31-4\n",
    "jaguar": f"config:\n  azure-native:location: eastus2\n  azure-native:subscriptionId: {SUBSCRIPTION}\n",
}


def healthy_state() -> dict:
    return {
        "pulumi": {"version": "v3.272.0", "user": "alice", "url": "https://api.pulumi.com",
                   "stacks": [{"name": name, "current": False, "resourceCount": 0} for name in STACKS]},
        "aws": {
            "identity": {"UserId": "AROAEXAMPLE:alice", "Account": ACCOUNT,
                         "Arn": f"arn:aws:sts::{ACCOUNT}:assumed-role/corral-deployer/alice"},
            "allowed": "*",
            "images": {"ami-0123456789abcdef0": {"State": "available", "Name": "corral-node-k8s-1-30-8"},
                       "ami-0fedcba9876543210": {"State": "available", "Name": "corral-gpu-node-k8s-1-30-8"}},
            "instance_types": {"m7i.4xlarge": 16, "r7i.2xlarge": 8, "m7i.16xlarge": 64, "g5.12xlarge": 48,
                               "g5.48xlarge": 192},
            "quotas": {"L-1216C47A": 20000, "L-DB2E81BA": 12000},
        },
        "gcloud": {
            "accounts": [{"account": "alice@example.com", "status": "ACTIVE"}], "adc": True,
            "images": {"projects/corral-images/global/images/family/corral-node":
                       {"name": "corral-node-k8s-1-31-4", "status": "READY"},
                       "projects/corral-images/global/images/corral-gpu-node-k8s-1-31-4":
                       {"name": "corral-gpu-node-k8s-1-31-4", "status": "READY"}},
            "machine_types": {"n2-standard-16": 16, "c3-highmem-8": 8, "n2-standard-64": 64,
                              "a2-highgpu-8g": 96, "g2-standard-48": 48},
            "quotas": [{"metric": m, "limit": v, "usage": 0} for m, v in
                       {"N2_CPUS": 10000, "C3_CPUS": 100, "G2_CPUS": 4000, "PREEMPTIBLE_CPUS": 2000,
                        "PREEMPTIBLE_NVIDIA_A100_GPUS": 256, "NVIDIA_L4_GPUS": 256}.items()],
        },
        "az": {
            "account": {"id": SUBSCRIPTION, "name": "research", "tenantId": "t",
                        "user": {"name": "alice@example.com", "type": "user"}},
            "roles": ["Owner"],
            "images": ["Debian:debian-12:12-gen2:latest"],
            "skus": {"Standard_D32s_v5": {"family": "standardDSv5Family", "vCPUs": 32},
                     "Standard_E16s_v5": {"family": "standardESv5Family", "vCPUs": 16},
                     "Standard_D64s_v5": {"family": "standardDSv5Family", "vCPUs": 64}},
            "usage": {"standardDSv5Family": 20000, "standardESv5Family": 200, "cores": 20000},
        },
        "ping": {"answer": []},
    }


class World:
    """The project folder and the fakes' state; `context(name)` a check's Context."""

    def __init__(self, tmp_path: Path) -> None:
        self.project = tmp_path / "project"
        self.clusters = self.project / "clusters"
        self.clusters.mkdir(parents=True)
        for path in (ROOT / "clusters").glob("*.yaml"):
            shutil.copy(path, self.clusters / path.name)
        (self.project / "Pulumi.yaml").write_text("name: corral\nruntime: python\nstackConfigDir: stacks\n")
        (self.project / "stacks").mkdir()
        for name, text in STACKS.items():
            (self.project / "stacks" / f"Pulumi.{name}.yaml").write_text(text)
        self.state = healthy_state()
        self.state_file = tmp_path / "fake-state.json"
        self.log = tmp_path / "fake-calls.jsonl"
        self.env = {**os.environ, "PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}",
                    "FAKE_DOCTOR_STATE": str(self.state_file), "FAKE_DOCTOR_LOG": str(self.log)}
        self.save()

    def save(self) -> None:
        self.state_file.write_text(json.dumps(self.state))

    def stack(self, name: str, text: str) -> None:
        (self.project / "stacks" / f"Pulumi.{name}.yaml").write_text(text)

    def context(self, name: str, **env) -> Context:
        self.save()
        cluster = load_fleet([self.clusters]).clusters[name]
        return Context(cluster, self.clusters, self.project, Cli(timeout=20, env={**self.env, **env}))

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def world(tmp_path) -> World:
    return World(tmp_path)
