"""On-prem hosts (ssh, sudo, OS, host keys) and the sites' VPN peers, as `corral join` reaches them."""

from __future__ import annotations

import ipaddress
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from corral.model import Cluster, OnPremPool
from corral.nodes import known_hosts
from corral.nodes.inventory import pool_ssh_options

from .checks import Context, Finding, Status
from .runner import Cli, Unanswered

# Seconds ssh waits for the TCP connection (ssh_config(5) ConnectTimeout);
# BatchMode=yes: never ask for a password or passphrase, fail instead.
CONNECT_TIMEOUT = 10
PARALLEL = 8
# One fixed command on every host: passwordless sudo (sudo(8): -n "non-interactive:
# fail instead of prompting"), then the OS (os-release(5): ID, VERSION_ID).
PROBE = "if sudo -n true 2>/dev/null; then echo corral-sudo=yes; else echo corral-sudo=no; fi; cat /etc/os-release"
WANTED_OS = ("debian", "12")   # the OS the Ansible roles target (ansible/roles/*/meta)
SHOWN = 5
# RFC 5737: addresses for documentation only, never a real peer.
DOCUMENTATION_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]


@dataclass(frozen=True)
class HostProbe:
    host: str
    reached: bool
    detail: str = ""        # why ssh failed
    sudo: bool = False
    os_id: str = ""
    os_version: str = ""


def ssh_argv(cluster: Cluster, pool: OnPremPool, host: str) -> list[str]:
    """ssh to `host` exactly as `corral join`'s inventory reaches it: its address, the
    pool's user, port and key, host key checked against the cluster's known hosts
    under the host's name, through the site's jump host (corral/nodes/inventory.py)."""
    ssh = cluster.ssh_for(pool)
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            *pool_ssh_options(cluster, pool), "-o", f"HostKeyAlias={host}", "-p", str(ssh.port or 22)]
    if ssh.private_key_file:
        # `~` as the join reads it: ansible-core's ssh plugin passes IdentityFile through
        # os.path.expanduser ($HOME; plugins/connection/ssh.py), while ssh(1) itself would
        # take the passwd entry's home, another key whenever $HOME is set elsewhere.
        argv += ["-i", os.path.expanduser(ssh.private_key_file), "-o", "IdentitiesOnly=yes"]
    if ssh.user:
        argv += ["-l", ssh.user]
    return [*argv, pool.host_addresses.get(host, host), PROBE]


# What ssh (and a jump host's ssh) says when it cannot get in, most telling first.
SSH_FAILURES = ("Host key verification failed", "Could not resolve hostname", "Connection refused", "timed out",
                "No route to host", "Permission denied")


def _reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    telling = [line for cause in SSH_FAILURES for line in lines if cause in line]
    return (telling or lines[-1:] or ["no answer"])[0][:160]


def probe(cli: Cli, cluster: Cluster, pool: OnPremPool, host: str) -> HostProbe:
    try:
        answer = cli.run(ssh_argv(cluster, pool, host), timeout=CONNECT_TIMEOUT + 20)
    except Unanswered as why:
        return HostProbe(host, False, str(why))
    if answer.returncode == 255:   # ssh's own failure (ssh(1), EXIT STATUS)
        return HostProbe(host, False, _reason(answer.stderr))
    release = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', answer.stdout, re.MULTILINE))
    return HostProbe(host, True, sudo="corral-sudo=yes" in answer.stdout,
                     os_id=release.get("ID", ""), os_version=release.get("VERSION_ID", ""))


def _names(hosts: list[str]) -> str:
    return ", ".join(hosts[:SHOWN]) + (f" and {len(hosts) - SHOWN} more" if len(hosts) > SHOWN else "")


def check_host_keys(ctx: Context) -> list[Finding]:
    if not ctx.cluster.onprem_pools:
        return []
    path = ctx.cluster.known_hosts_file
    fix = f"corral hosts trust {ctx.name}  (review the keys it records, then commit the file)"
    if path is None or not path.exists():
        return [Finding("onprem.hostkeys", Status.fail, f"no recorded ssh host keys ({path} does not exist)", fix)]
    try:
        recorded = known_hosts.read(path)
    except known_hosts.KnownHostsError as error:
        return [Finding("onprem.hostkeys", Status.fail, str(error), fix)]
    found = known_hosts.targets(ctx.cluster)
    missing = [t.name for t in known_hosts.jump_targets(found) + found if t.name not in recorded]
    if missing:
        return [Finding("onprem.hostkeys", Status.fail, f"no recorded host key for {_names(missing)} in {path.name}",
                        fix)]
    return [Finding("onprem.hostkeys", Status.passed, f"{path.name} records a key for all {len(found)} hosts")]


def check_hosts(ctx: Context) -> list[Finding]:
    pools = ctx.cluster.onprem_pools
    if not pools:
        return []
    if not ctx.cli.available("ssh"):
        return [Finding("onprem.ssh", Status.fail, "ssh is not installed (not on PATH)", "apt-get install openssh-client")]
    jobs = [(pool, host) for pool in pools for host in pool.host_names]
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool_of_workers:
        probes = list(pool_of_workers.map(lambda job: probe(ctx.cli, ctx.cluster, *job), jobs))
    total = len(probes)
    down = [p for p in probes if not p.reached]
    findings = []
    if down:
        reasons = "; ".join(f"{p.host}: {p.detail}" for p in down[:3])
        keys = any("Host key verification failed" in p.detail for p in down)
        fix = (f"corral hosts trust {ctx.name}" if keys else
               "start sshd on them and check the address, user and key in the cluster file (docs/onprem-hosts.md)")
        findings.append(Finding("onprem.ssh", Status.fail, f"{len(down)} of {total} hosts unreachable over ssh "
                                                          f"({reasons})", fix))
    else:
        findings.append(Finding("onprem.ssh", Status.passed, f"all {total} hosts answer over ssh"))
    up = [p for p in probes if p.reached]
    if not up:
        return findings + [Finding("onprem.sudo", Status.skip, "no host reached"),
                           Finding("onprem.os", Status.skip, "no host reached")]
    no_sudo = [p.host for p in up if not p.sudo]
    findings.append(
        Finding("onprem.sudo", Status.fail, f"no passwordless sudo on {_names(no_sudo)} ({len(no_sudo)} of {len(up)})",
                "give the ssh user NOPASSWD sudo: echo 'USER ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/corral")
        if no_sudo else Finding("onprem.sudo", Status.passed, f"passwordless sudo on all {len(up)} reached hosts"))
    wrong = [f"{p.host} ({p.os_id or '?'} {p.os_version or '?'})" for p in up if (p.os_id, p.os_version) != WANTED_OS]
    findings.append(
        Finding("onprem.os", Status.fail, f"not Debian 12: {_names(wrong)}",
                "reinstall them with Debian 12 (bookworm), the OS the roles support")
        if wrong else Finding("onprem.os", Status.passed, f"Debian 12 on all {len(up)} reached hosts"))
    return findings


def check_vpn_peers(ctx: Context) -> list[Finding]:
    findings = []
    for index, site in enumerate(ctx.cluster.sites):
        if site.vpn is None:
            continue
        address = site.vpn.peer_address
        where = f"sites[{index}].vpn.peerAddress"
        if any(address in net for net in DOCUMENTATION_NETS):
            findings.append(Finding("site.vpn", Status.fail,
                                    f"{site.name}: {where} {address} is a documentation address (RFC 5737), "
                                    "no real VPN device", f"set {where} in clusters/{ctx.name}.yaml to the "
                                    "public address of the site's VPN device"))
            continue
        if address.is_private:
            findings.append(Finding("site.vpn", Status.warn, f"{site.name}: {where} {address} is private: a cloud "
                                    "VPN gateway reaches its peer over the internet", "check it is the device's "
                                    "public address"))
            continue
        # An IKE (UDP 500/4500) exchange needs a VPN client and the peer's
        # settings; an ICMP echo is what can be tried from here.
        try:
            answer = ctx.cli.run(["ping", "-c", "3", "-W", "2", str(address)], timeout=15)
        except Unanswered as why:
            findings.append(Finding("site.vpn", Status.warn, f"{site.name}: cannot probe {address}: {why}", why.fix))
            continue
        if answer.ok:
            findings.append(Finding("site.vpn", Status.passed, f"{site.name}: {address} answers ICMP (the address "
                                    "is up; IKE on UDP 500/4500 cannot be tried from here)"))
        else:
            findings.append(Finding("site.vpn", Status.warn, f"{site.name}: {address} does not answer ICMP (many VPN "
                                    "devices drop it: this proves nothing either way)",
                                    f"ask the site's network team that UDP 500 and 4500 to {address} are open"))
    return findings
