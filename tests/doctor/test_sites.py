"""The VPN peer check and the host key check, without hosts (the hostlab test has real ones)."""

from __future__ import annotations

from corral.doctor import Status
from corral.doctor.onprem import check_host_keys, check_vpn_peers


def with_peer(world, address: str):
    path = world.clusters / "jaguar.yaml"
    path.write_text(path.read_text().replace("203.0.113.10", address))
    return world.context("jaguar")


def test_a_documentation_address_is_no_peer(world):
    [found] = check_vpn_peers(world.context("jaguar"))
    assert found.status is Status.fail
    assert found.finding == ("sf1: sites[0].vpn.peerAddress 203.0.113.10 is a documentation address (RFC 5737), "
                             "no real VPN device")
    assert "clusters/jaguar.yaml" in found.fix
    assert world.calls() == []           # nothing to probe


def test_a_peer_that_answers_passes_and_silence_only_warns(world):
    world.state["ping"]["answer"] = ["34.120.0.10"]
    [answered] = check_vpn_peers(with_peer(world, "34.120.0.10"))
    assert answered.status is Status.passed and "IKE on UDP 500/4500 cannot be tried from here" in answered.finding
    world.state["ping"]["answer"] = []
    [silent] = check_vpn_peers(world.context("jaguar"))
    assert silent.status is Status.warn and "proves nothing" in silent.finding


def test_no_ping_warns_with_the_install_hint(world, tmp_path):
    ctx = with_peer(world, "34.120.0.10")
    ctx.cli.env["PATH"] = str(tmp_path)
    [found] = check_vpn_peers(ctx)
    assert (found.status, found.fix) == (Status.warn, "apt-get install iputils-ping")


def test_host_keys_must_be_recorded_for_every_host_and_the_jump_host(world):
    [missing] = check_host_keys(world.context("jaguar"))
    assert missing.status is Status.fail and missing.fix.startswith("corral hosts trust jaguar")
    (world.clusters / "jaguar.known_hosts").write_text(
        "bastion.sf1.internal ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    [partly] = check_host_keys(world.context("jaguar"))
    assert partly.status is Status.fail
    assert partly.finding.startswith("no recorded host key for gpu-001.sf1.internal, gpu-002.sf1.internal")
