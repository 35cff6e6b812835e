"""The API servers' certificate names every address and name clients reach
them by: on AWS each zone's load balancer address and the load balancer's
DNS name (read at boot from an instance tag), elsewhere the one VIP."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from corral.machine.api_server import (
    API_DNS_NAME_SCRIPT,
    API_DNS_NAME_TAG,
    API_DNS_SAN_PLACEHOLDER,
    api_cert_sans,
    render_api_dns_name_script,
    render_kubeadm_init_config,
)
from corral.machine.cloud_init import render_api_server_cloud_init
from corral.machine.kubeadm import KUBEADM_DIR, PROVIDER_ID_PLACEHOLDER
from corral.machine.kubelet_node import METADATA_URL, PROVIDER_ID_SCRIPT
from corral.model import load_fleet
from corral.model.layout import layout

from .conftest import EXAMPLES
from .test_aws import Plan, build, heron_with
from .test_provider_ids import AWS_MACHINE, TOKENS, fake_metadata_server, files_of, ref  # noqa: F401

DNS_NAME = "internal-heron-api-0123456789.elb.us-west-2.amazonaws.com"


def example(name: str):
    return load_fleet([EXAMPLES]).clusters[name]


def cert_sans(init_config: str) -> list[str]:
    (cluster_config,) = [d for d in yaml.safe_load_all(init_config) if d and d["kind"] == "ClusterConfiguration"]
    return cluster_config["apiServer"]["certSANs"]


@pytest.fixture(scope="module")
def heron_plan() -> Plan:
    return build(heron_with())


def test_aws_certificate_names_every_load_balancer_address_and_its_dns_name(heron_plan: Plan):
    heron = heron_plan.cluster
    lay = layout(heron)
    sans = cert_sans(render_kubeadm_init_config(heron, lay, TOKENS))
    (lb,) = heron_plan.of("aws:lb/loadBalancer:LoadBalancer")
    lb_addresses = [m["privateIpv4Address"] for m in lb.inputs["subnetMappings"]]
    assert len(lb_addresses) == len(lay.zones) == 3
    assert sans[0] == lay.api_vip  # the endpoint kubeconfigs use, first
    assert sorted(sans[:-1]) == sorted(lb_addresses)  # every zone's address, as the NLB has them
    assert sans[-1] == API_DNS_SAN_PLACEHOLDER  # the name, filled in at boot
    assert sans == api_cert_sans(heron, lay)


def test_aws_api_servers_carry_the_load_balancer_dns_name_in_readable_tags(heron_plan: Plan):
    (lb,) = heron_plan.of("aws:lb/loadBalancer:LoadBalancer")
    dns_name = f"{lb.name}.elb.amazonaws.com"  # what test_aws's mocks answer for dnsName
    for server in heron_plan.ctx.layout.api_servers:
        instance = heron_plan.one("aws:ec2/instance:Instance", server.name)
        assert instance.inputs["tags"][API_DNS_NAME_TAG] == dns_name
        assert instance.inputs["metadataOptions"]["instanceMetadataTags"] == "enabled"
        assert instance.inputs["metadataOptions"]["httpTokens"] == "required"
    # Tags in instance metadata refuse keys with "/" or spaces; none here.
    for server in heron_plan.ctx.layout.api_servers:
        keys = heron_plan.one("aws:ec2/instance:Instance", server.name).inputs["tags"]
        assert all("/" not in key and " " not in key for key in keys)


@pytest.mark.parametrize("name", ["jaguar", "ibis"])
def test_single_vip_clouds_name_their_vip_only(name):
    cluster = example(name)
    lay = layout(cluster)
    assert cert_sans(render_kubeadm_init_config(cluster, lay, TOKENS)) == [lay.api_vip]
    files = files_of(render_api_server_cloud_init(cluster, lay, 0, ref(cluster)))
    assert API_DNS_NAME_SCRIPT not in files
    assert API_DNS_SAN_PLACEHOLDER not in files["/usr/local/sbin/corral-api-server"]["content"]


def test_dns_name_script_reads_the_instance_tag(fake_metadata_server, tmp_path):  # noqa: F811
    base_url, state = fake_metadata_server
    state.values[f"aws:tags/instance/{API_DNS_NAME_TAG}"] = DNS_NAME
    script = tmp_path / "api-dns-name.sh"
    script.write_text(render_api_dns_name_script(base_url, attempts=2, retry_seconds=0))
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == DNS_NAME + "\n"
    assert state.requests[0] == "PUT /latest/api/token"


@pytest.mark.parametrize(("tag", "message"), [
    (None, f"no instance tag {API_DNS_NAME_TAG}"),
    ("evil.example.com; rm -rf /", "not a DNS name"),
])
def test_dns_name_script_fails_clearly(tag, message, fake_metadata_server, tmp_path):  # noqa: F811
    base_url, state = fake_metadata_server
    if tag is not None:
        state.values[f"aws:tags/instance/{API_DNS_NAME_TAG}"] = tag
    script = tmp_path / "api-dns-name.sh"
    script.write_text(render_api_dns_name_script(base_url, attempts=2, retry_seconds=0))
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and result.stdout == ""
    assert message in result.stderr


def test_api_server_boot_fills_the_dns_name_and_provider_id_into_its_kubeadm_configs(fake_metadata_server, tmp_path):  # noqa: F811
    """The first API server's boot script, up to where it starts services, run
    with bash against the fake metadata service: the configs kubeadm reads
    name the DNS name among the SANs and carry the provider ID."""
    base_url, state = fake_metadata_server
    state.values.update(AWS_MACHINE)
    state.values[f"aws:tags/instance/{API_DNS_NAME_TAG}"] = DNS_NAME
    heron = example("heron")
    lay = layout(heron)
    files = files_of(render_api_server_cloud_init(heron, lay, 0, ref(heron)))
    kubeadm_dir, sbin = tmp_path / "kubeadm", tmp_path / "sbin"
    kubeadm_dir.mkdir(), sbin.mkdir()
    init = kubeadm_dir / "init.yaml"
    init.write_text(render_kubeadm_init_config(heron, lay, TOKENS))  # the config `kubeadm init` reads
    for path, file in files.items():
        if path.startswith(KUBEADM_DIR + "/") and path.endswith(".yaml"):
            (kubeadm_dir / Path(path).name).write_text(file["content"])
    (sbin / "corral-node-prep").write_text("#!/bin/bash\ntrue\n")
    for script in (PROVIDER_ID_SCRIPT, API_DNS_NAME_SCRIPT):
        (sbin / Path(script).name).write_text(files[script]["content"].replace(METADATA_URL, base_url))
    for script in sbin.iterdir():
        script.chmod(0o755)
    boot = files["/usr/local/sbin/corral-api-server"]["content"]
    before_services = boot[: boot.index("systemctl ")]
    # Without the exit trap that removes the token and init config: this test reads them after.
    before_services = "\n".join(line for line in before_services.splitlines() if not line.startswith("trap "))
    before_services = before_services.replace(KUBEADM_DIR, str(kubeadm_dir)).replace("/usr/local/sbin/", f"{sbin}/")
    env = {"PATH": os.environ["PATH"], "no_proxy": "*", "NO_PROXY": "*"}
    result = subprocess.run(["bash", "-c", before_services], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    sans = cert_sans(init.read_text())
    assert sans == [*api_cert_sans(heron, lay)[:-1], DNS_NAME]
    for config in kubeadm_dir.glob("*.yaml"):
        assert API_DNS_SAN_PLACEHOLDER not in config.read_text()
        assert PROVIDER_ID_PLACEHOLDER not in config.read_text()
    assert "aws:///us-west-2b/i-0123456789abcdef0" in init.read_text()
