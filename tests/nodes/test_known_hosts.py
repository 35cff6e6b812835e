"""The on-prem hosts' ssh host keys (corral/nodes/known_hosts.py, docs/onprem-hosts.md).

`corral hosts trust` records what ssh-keyscan sees - by address where the
cluster file gives one, through the site's jump host - in a reviewed file
beside the cluster file; a changed key is reported, never written over
silently; `corral join` stops before any task when a host presents a key the
file does not have. ssh-keyscan and ssh are test fakes at the process
boundary (tests/nodes/fake_ssh_keyscan, fake_ssh); the ssh options the
inventory builds are checked with the real ssh's `-G`.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.model import load_cluster
from corral.nodes import known_hosts
from corral.nodes.inventory import build
from corral.nodes.known_hosts import KnownHostsError, fingerprint, read, trust, verify

from .ssh_fakes import FakeSshNetwork, fake_key

ROBOTICS_HOSTS = 'hosts: ["gpu-[065:072].sf1.internal"]'
BASTION = "bastion.sf1.internal"


def small_fleet(folder: Path, jump: bool = True, port: int | None = None) -> Path:
    """jaguar with two small pools: one by name (DNS), one by address (rack r13 has no DNS)."""
    from tests.conftest import EXAMPLES

    text = (EXAMPLES / "jaguar.yaml").read_text()
    text = text.replace('hosts: ["gpu-[001:064].sf1.internal"]', 'hosts: ["gpu-[001:002].sf1.internal"]', 1)
    text = text.replace('\n    racks: ["sf1-r[01:08]"]', "", 1)  # 8 racks do not divide 2 hosts
    pool_ssh = f"\n    ssh: {{port: {port}}}" if port else ""
    text = text.replace(ROBOTICS_HOSTS, 'hosts: ["gpu-[065:067].sf1.internal"]\n'
                        '    addresses: ["10.50.13.[65:67]"]' + pool_ssh, 1)
    if not jump:
        text = text.replace(", jumpHost: {host: bastion.sf1.internal}", "")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "jaguar.yaml").write_text(text)
    return folder / "jaguar.yaml"


NAMED = ["gpu-001.sf1.internal", "gpu-002.sf1.internal"]
ADDRESSED = {"gpu-065.sf1.internal": "10.50.13.65", "gpu-066.sf1.internal": "10.50.13.66",
             "gpu-067.sf1.internal": "10.50.13.67"}


@pytest.fixture
def network(tmp_path, monkeypatch):
    fake = FakeSshNetwork(tmp_path / "net").install(monkeypatch)
    for address in [*NAMED, *ADDRESSED.values(), BASTION]:
        fake.add(address)
    return fake


@pytest.fixture
def cluster_file(tmp_path):
    return small_fleet(tmp_path / "clusters")


def test_trust_records_every_host_by_name_and_its_jump_host(network, cluster_file):
    result = trust(load_cluster(cluster_file))
    path = cluster_file.with_suffix(".known_hosts")
    assert result.path == path and result.written
    assert sorted(result.added) == sorted([*NAMED, *ADDRESSED, BASTION])
    recorded = read(path)
    # Hosts reached by address are recorded under their names (ssh looks them up by HostKeyAlias).
    assert recorded["gpu-065.sf1.internal"] == frozenset(map(tuple, network.hosts["10.50.13.65"]["keys"]))
    assert recorded[BASTION] == frozenset(map(tuple, network.hosts[BASTION]["keys"]))
    assert "10.50.13.65" not in path.read_text()
    # The hosts were scanned from the jump host, by address where they have one; the jump host directly.
    calls = network.calls()
    assert calls[0] == {"argv": calls[0]["argv"], "addresses": [BASTION], "via": None}
    behind = [c for c in calls if c["via"] == BASTION]
    assert sorted(a for c in behind for a in c["addresses"]) == sorted([*NAMED, *ADDRESSED.values()])
    # Sorted lines: the order of a review diff never moves.
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    assert lines == sorted(lines) and len(lines) == 2 * 6


def test_a_second_trust_with_the_same_keys_changes_nothing(network, cluster_file):
    cluster = load_cluster(cluster_file)
    trust(cluster)
    path = cluster_file.with_suffix(".known_hosts")
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    again = trust(cluster)
    assert not again.written and not again.added and not again.changed
    assert len(again.unchanged) == 6
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime


def test_a_changed_key_is_reported_and_kept_until_replace(network, cluster_file):
    cluster = load_cluster(cluster_file)
    trust(cluster)
    path = cluster_file.with_suffix(".known_hosts")
    before = path.read_text()
    old = network.hosts["10.50.13.66"]["keys"]
    new = network.add("10.50.13.66", generation=1)   # reinstalled, or someone in its place
    result = trust(cluster)
    assert list(result.changed) == ["gpu-066.sf1.internal"]
    assert fingerprint(old[0][1]) in result.changed["gpu-066.sf1.internal"]
    assert fingerprint(new[0][1]) in result.changed["gpu-066.sf1.internal"]
    assert path.read_text() == before and not result.written
    replaced = trust(cluster, replace=["gpu-066.sf1.internal"])
    assert replaced.replaced == ["gpu-066.sf1.internal"] and replaced.written
    assert read(path)["gpu-066.sf1.internal"] == frozenset(map(tuple, new))
    assert read(path)["gpu-065.sf1.internal"] == frozenset(map(tuple, network.hosts["10.50.13.65"]["keys"]))


def test_an_added_key_type_is_a_change_too(network, cluster_file):
    """A host already trusted may not slip in another key beside its own."""
    cluster = load_cluster(cluster_file)
    trust(cluster)
    network.hosts["10.50.13.65"]["keys"].append(["ssh-rsa", fake_key("intruder", "ssh-rsa")])
    network.path.write_text(json.dumps({"hosts": network.hosts}))
    assert list(trust(cluster).changed) == ["gpu-065.sf1.internal"]


def test_nothing_is_scanned_through_a_jump_host_whose_key_changed(network, cluster_file):
    cluster = load_cluster(cluster_file)
    trust(cluster)
    network.add(BASTION, generation=1)
    with pytest.raises(KnownHostsError, match=f"jump host {BASTION}: recorded .* presents .*"
                                              f"corral hosts trust jaguar --replace {BASTION}"):
        trust(cluster)
    assert all(c["via"] is None for c in network.calls()[-1:])


def test_hosts_that_do_not_answer_are_listed_and_the_cli_exits_1(network, cluster_file):
    network.remove("10.50.13.67")
    result = CliRunner().invoke(app, ["hosts", "trust", "jaguar", "--clusters", str(cluster_file.parent)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "5 added, 0 replaced, 0 unchanged, 0 changed (kept), 1 not scanned" in result.output
    assert "not scanned (no answer): gpu-067.sf1.internal" in result.output


def test_cli_reports_a_changed_key_with_the_command_that_replaces_it(network, cluster_file):
    runner, args = CliRunner(), ["hosts", "trust", "jaguar", "--clusters", str(cluster_file.parent)]
    assert runner.invoke(app, args).exit_code == 0
    network.add("gpu-002.sf1.internal", generation=1)
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "CHANGED, kept the recorded keys: gpu-002.sf1.internal: recorded" in result.output
    assert "corral hosts trust jaguar --replace gpu-002.sf1.internal" in result.output
    assert runner.invoke(app, [*args, "--replace", "gpu-002.sf1.internal"]).exit_code == 0
    assert runner.invoke(app, [*args, "--replace", "gpu-999.sf1.internal"]).exit_code == 1


def test_site_option_scans_only_that_sites_hosts(network, cluster_file):
    result = CliRunner().invoke(app, ["hosts", "trust", "jaguar", "--clusters", str(cluster_file.parent),
                                      "--site", "nyc"])
    assert result.exit_code == 1 and "has no site 'nyc' (sites: sf1)" in result.output
    assert not network.calls()


def test_a_port_other_than_22_is_scanned_there_and_recorded_under_the_plain_name(tmp_path, network):
    cluster_file = small_fleet(tmp_path / "clusters", jump=False, port=2222)
    for address in ADDRESSED.values():
        network.add(address, port=2222)
    result = trust(load_cluster(cluster_file))
    assert sorted(result.added) == sorted([*NAMED, *ADDRESSED])
    assert "gpu-065.sf1.internal ssh-ed25519 " in cluster_file.with_suffix(".known_hosts").read_text()
    assert any("2222" in c["argv"] and "10.50.13.65" in c["addresses"] for c in network.calls())


def test_a_bad_line_in_the_file_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "jaguar.known_hosts"
    path.write_text(f"# comment\ngpu-001.sf1.internal ssh-ed25519 {fake_key('a')}\n"
                    "gpu-002.sf1.internal ssh-ed25519 not-base64!\n")
    with pytest.raises(KnownHostsError, match=rf"{path}:3: expected 'HOST KEYTYPE BASE64-KEY'"):
        read(path)
    path.write_text(f"@cert-authority *.sf1.internal ssh-ed25519 {fake_key('ca')}\n")
    with pytest.raises(KnownHostsError, match=rf"{path}:1:"):
        read(path)


# ------------------------------------------------------------------ verify


def test_verify_needs_the_file_and_every_host_in_it(network, cluster_file):
    cluster = load_cluster(cluster_file)
    with pytest.raises(KnownHostsError, match="jaguar.known_hosts does not exist; run `corral hosts trust jaguar`"):
        verify(cluster, NAMED)
    trust(cluster)
    path = cluster_file.with_suffix(".known_hosts")
    path.write_text("\n".join(line for line in path.read_text().splitlines() if "gpu-001" not in line) + "\n")
    with pytest.raises(KnownHostsError, match="no recorded ssh host key for gpu-001.sf1.internal in .*known_hosts"):
        verify(cluster, NAMED)
    verify(cluster, ["gpu-002.sf1.internal"])


def test_verify_passes_unchanged_hosts_and_leaves_silent_ones_to_the_join(network, cluster_file):
    cluster = load_cluster(cluster_file)
    trust(cluster)
    network.remove("10.50.13.65")
    verify(cluster, [*NAMED, *ADDRESSED])


def test_verify_names_a_changed_host_the_file_and_the_command(network, cluster_file):
    cluster = load_cluster(cluster_file)
    trust(cluster)
    network.add("10.50.13.66", generation=1)
    with pytest.raises(KnownHostsError) as raised:
        verify(cluster, [*NAMED, *ADDRESSED])
    message = str(raised.value)
    assert message.startswith("ssh host key changed for gpu-066.sf1.internal (the keys recorded in "
                              f"{cluster_file.with_suffix('.known_hosts')} differ")
    assert "Nothing was run" in message
    assert "`corral hosts trust jaguar --replace gpu-066.sf1.internal`" in message
    # Another selection without that host still passes.
    verify(cluster, NAMED)


def test_verify_checks_the_jump_host_first(network, cluster_file):
    cluster = load_cluster(cluster_file)
    trust(cluster)
    network.add(BASTION, generation=1)
    with pytest.raises(KnownHostsError, match=f"ssh host key changed for {BASTION}"):
        verify(cluster, NAMED)


# ------------------------------------------------------------------ ssh options


def _ssh_config(common_args: str, host: str, address: str | None) -> dict[str, str]:
    """What the real ssh makes of the options (`ssh -G` resolves them and connects to nothing)."""
    result = subprocess.run(["ssh", "-G", *shlex.split(common_args), address or host],
                            capture_output=True, text=True, check=True)
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh for -G")
def test_the_inventorys_ssh_options_check_keys_against_the_file_only(cluster_file):
    cluster = load_cluster(cluster_file)
    hostvars = build(cluster)["_meta"]["hostvars"]
    path = cluster_file.with_suffix(".known_hosts")
    addressed = hostvars["gpu-065.sf1.internal"]
    assert addressed["ansible_host"] == "10.50.13.65"
    config = _ssh_config(addressed["ansible_ssh_common_args"], "gpu-065.sf1.internal", "10.50.13.65")
    assert config["hostname"] == "10.50.13.65"
    assert config["stricthostkeychecking"] == "true"
    assert config["userknownhostsfile"] == str(path)
    assert config["hostkeyalias"] == "gpu-065.sf1.internal"
    # The jump host: a ProxyCommand whose own ssh checks the bastion against the same file.
    proxy = shlex.split(config["proxycommand"])
    assert proxy[0] == "ssh" and proxy[-3:] == ["-W", "[%h]:%p", BASTION]
    assert f"UserKnownHostsFile={path}" in proxy and "StrictHostKeyChecking=yes" in proxy
    assert f"HostKeyAlias={BASTION}" in proxy and ["-l", "corral"] == proxy[proxy.index("-l"):proxy.index("-l") + 2]
    named = hostvars["gpu-001.sf1.internal"]
    assert "ansible_host" not in named
    assert _ssh_config(named["ansible_ssh_common_args"], "gpu-001.sf1.internal", None)["hostkeyalias"] == \
        "gpu-001.sf1.internal"


def test_a_known_hosts_path_with_percent_or_spaces_survives_ssh(tmp_path):
    """ssh expands %-tokens in UserKnownHostsFile and ProxyCommand, and runs ProxyCommand with a shell."""
    cluster_file = small_fleet(tmp_path / "100% my clusters")
    hostvars = build(load_cluster(cluster_file))["_meta"]["hostvars"]
    config = _ssh_config(hostvars["gpu-065.sf1.internal"]["ansible_ssh_common_args"], "gpu-065", "10.50.13.65")
    assert config["userknownhostsfile"] == str(cluster_file.with_suffix(".known_hosts"))
    proxy = shlex.split(config["proxycommand"].replace("%%", "%"))
    assert f"UserKnownHostsFile={cluster_file.with_suffix('.known_hosts')}".replace("%", "%%") in proxy


def test_pool_connection_variables(cluster_file):
    inventory = build(load_cluster(cluster_file))
    pool = inventory["pool_gpu_h100_robotics"]["vars"]
    assert pool["ansible_user"] == "corral" and pool["ansible_ssh_private_key_file"] == "~/.ssh/corral_sf1"
    assert pool["ansible_host_key_checking"] is True
    assert "ansible_port" not in pool   # ssh's default
    assert "ansible_user" not in inventory["site_sf1"]["vars"]   # site groups outrank pool groups: not there


def test_trust_writes_atomically(network, cluster_file, monkeypatch):
    """The file is replaced whole (corral.util.write_atomic), never left half-written."""
    seen = []
    monkeypatch.setattr(known_hosts, "write_atomic", lambda path, text: seen.append((path, text)))
    trust(load_cluster(cluster_file))
    assert [path for path, _ in seen] == [cluster_file.with_suffix(".known_hosts")]


def test_ansible_connects_to_the_address_with_the_hosts_own_options(cluster_file, tmp_path):
    """The inventory corral join hands ansible-runner, read by ansible-inventory."""
    from corral.nodes.inventory import as_yaml_inventory, to_ansible_json

    source = tmp_path / "hosts.json"
    source.write_text(json.dumps(to_ansible_json(as_yaml_inventory(build(load_cluster(cluster_file))))))
    result = subprocess.run(["ansible-inventory", "-i", str(source), "--host", "gpu-066.sf1.internal"],
                            capture_output=True, text=True, check=True)
    host_vars = json.loads(result.stdout)
    assert host_vars["ansible_host"] == "10.50.13.66"
    assert host_vars["ansible_ssh_common_args"].endswith("-o HostKeyAlias=gpu-066.sf1.internal")
    assert host_vars["corral_pool"] == "gpu-h100-robotics"


def test_a_relative_cluster_path_gives_an_absolute_known_hosts_path(tmp_path, monkeypatch):
    """ssh runs from Ansible's working directory: a relative path there names no file."""
    small_fleet(tmp_path / "clusters")
    monkeypatch.chdir(tmp_path)
    cluster = load_cluster(Path("clusters") / "jaguar.yaml")
    assert cluster.known_hosts_file == tmp_path / "clusters" / "jaguar.known_hosts"
    args = build(cluster)["_meta"]["hostvars"]["gpu-065.sf1.internal"]["ansible_ssh_common_args"]
    assert f"UserKnownHostsFile={tmp_path / 'clusters' / 'jaguar.known_hosts'}" in shlex.split(args)


def test_the_jump_login_reads_the_key_where_the_join_does(monkeypatch, tmp_path):
    # ansible-core expands the host's IdentityFile from $HOME; the jump host's ssh must take the
    # same file, not ssh(1)'s passwd-home reading of a literal `~`.
    from corral.model.schema import JumpHost
    from corral.nodes.known_hosts import jump_login

    monkeypatch.setenv("HOME", str(tmp_path))
    argv = jump_login(JumpHost(host="bastion.sf1.internal"), "corral", "~/.ssh/corral_sf1", None)
    assert argv[argv.index("-i") + 1] == f"{tmp_path}/.ssh/corral_sf1"
