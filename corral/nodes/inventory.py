"""The Ansible inventory of a cluster's on-prem nodes, built from the model.

Groups say what a host is (kubespray style): `onprem_nodes` holds every
on-prem host, `gpu_nodes` and `roce_nodes` what their names say, and each
host is in `site_<site>` and `pool_<pool>`. Cluster-wide settings are `all`
vars, site settings sit on the site group, pool settings on the pool group;
the roles' `defaults/main.yml` document every variable. No secret is ever in
the inventory: join material is passed at run time.

How Ansible reaches each host is in the inventory too (docs/onprem-hosts.md):
its address (`ansible_host`) where the cluster file gives one, the pool's
ssh user, port and key file, and ssh options that check its host key against
the cluster's known hosts file only, under its inventory name, through the
site's jump host if it has one (`connection_vars`).

Every string value is marked unsafe, so Ansible takes it literally and never
renders it as a template: the model's shapes already keep '{{' out, and this
holds even if one slipped through (a `{{ lookup('pipe', ...) }}` in a value
would otherwise run on the controller). The mark is `!unsafe` in YAML and
`{"__ansible_unsafe": ...}` in JSON (ansible-runner's inventory, `--list`).
"""

from __future__ import annotations

import io
import shlex
from typing import Any

from ruamel.yaml import YAML

from corral.machine import kubelet_reservations
from corral.machine.gpu_preflight import expectations as preflight_expectations
from corral.model import Cluster, OnPremPool
from corral.model.containerd import pause_image
from corral.model.hosts import RACK_LABEL

from .known_hosts import jump_login, ssh_path

UNSAFE_JSON_KEY = "__ansible_unsafe"
UNSAFE_YAML_TAG = "!unsafe"


class Unsafe(str):
    """A string Ansible must take literally; equal to the plain string."""

    __slots__ = ()


def mark_unsafe(value: Any) -> Any:
    """`value` with every string in it (not mapping keys) made Unsafe."""
    if isinstance(value, str):
        return Unsafe(value)
    if isinstance(value, dict):
        return {key: mark_unsafe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [mark_unsafe(item) for item in value]
    return value


def to_ansible_json(value: Any) -> Any:
    """Data for json.dumps with every Unsafe string as Ansible's JSON unsafe mark."""
    if isinstance(value, Unsafe):
        return {UNSAFE_JSON_KEY: str(value)}
    if isinstance(value, dict):
        return {key: to_ansible_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_ansible_json(item) for item in value]
    return value


def to_ansible_yaml(value: Any) -> str:
    """YAML text with every Unsafe string tagged `!unsafe`."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False
    yaml.representer.add_representer(
        Unsafe, lambda representer, data: representer.represent_scalar(UNSAFE_YAML_TAG, str(data))
    )
    stream = io.StringIO()
    yaml.dump(value, stream)
    return stream.getvalue()


def group_name(kind: str, name: str) -> str:
    """Ansible group names may not contain '-'; `pool_gpu_h100_sf1`."""
    return f"{kind}_{name}".replace("-", "_").replace(".", "_")


def cluster_vars(cluster: Cluster) -> dict[str, Any]:
    flannel = cluster.network.flannel
    arp = cluster.network.arp_cache
    return {
        "corral_cluster_name": cluster.name,
        "corral_kubernetes_version": cluster.kubernetes.version,
        "corral_containerd_version": cluster.kubernetes.containerd,
        "corral_containerd_sandbox_image": pause_image(cluster.kubernetes.version),
        "corral_pod_cidr": cluster.kubernetes.pod_cidr,
        "corral_service_cidr": cluster.kubernetes.service_cidr,
        "corral_flannel_backend": flannel.backend,
        "corral_flannel_direct_routing": flannel.direct_routing,
        "corral_flannel_mtu": flannel.mtu,
        "corral_flannel_port": flannel.port,
        "corral_flannel_vni": flannel.vni,
        "corral_arp_gc_thresh1": arp.gc_thresh1,
        "corral_arp_gc_thresh2": arp.gc_thresh2,
        "corral_arp_gc_thresh3": arp.gc_thresh3,
    }


def site_vars(cluster: Cluster, site_name: str) -> dict[str, Any]:
    site = cluster.site(site_name)
    return {
        "corral_site": site.name,
        "corral_site_cidrs": list(site.cidrs),
        "corral_apt_mirror": site.apt_mirror,
        "corral_http_proxy": site.http_proxy,
    }


def pool_vars(cluster: Cluster, pool: OnPremPool) -> dict[str, Any]:
    gpu, roce = pool.gpu, pool.roce
    return {
        "corral_pool": pool.name,
        "corral_gpu_model": gpu.model if gpu else None,
        "corral_gpu_count": gpu.count if gpu else 0,
        "corral_nvidia_driver_version": gpu.driver if gpu else None,
        "corral_nvidia_fabricmanager": bool(gpu and gpu.fabric_manager),
        "corral_roce_interfaces": list(roce.interfaces) if roce else [],
        "corral_roce_mtu": roce.mtu if roce else None,
        "corral_roce_pfc_priority": roce.pfc_priority if roce else None,
        "corral_roce_dscp": roce.dscp if roce else None,
        "corral_roce_ecn": roce.ecn if roce else False,
        "corral_node_labels": cluster.node_labels(pool),
        "corral_node_taints": [t.model_dump() for t in cluster.node_taints(pool)],
        # The GPU preflight's expectations, the same the health agent gives cloud nodes.
        "corral_gpu_preflight": preflight_expectations(cluster, pool),
        # The kubelet reservations script's inputs, the same cloud nodes of such a pool get.
        "corral_kubelet_reservations": kubelet_reservations.context(pool),
    }


def pool_ssh_options(cluster: Cluster, pool: OnPremPool) -> list[str]:
    """ssh options for every connection to a pool's hosts: their keys checked,
    against the cluster's known hosts file only, through the jump host if any.

    ssh takes the first value it gets for an option; Ansible puts these after
    its own ssh_args, which corral's ansible.cfg keeps free of host key
    options. A jump host goes in as an explicit ProxyCommand, not ProxyJump:
    the ssh that ProxyJump starts gets only -l, -p, -J and -F (OpenSSH
    ssh.c), not these -o options, so it would check the jump host against
    the user's own files.
    """
    ssh = cluster.ssh_for(pool)
    known_hosts = cluster.known_hosts_file
    options = ["-o", "StrictHostKeyChecking=yes"]
    if known_hosts is not None:
        options += ["-o", f"UserKnownHostsFile={ssh_path(known_hosts)}"]
    if ssh.jump_host is not None:
        login = jump_login(ssh.jump_host, ssh.user, ssh.private_key_file, known_hosts)
        # ssh expands %-tokens in ProxyCommand ('%%' a literal '%') and runs it with /bin/sh.
        inner = [shlex.quote(arg).replace("%", "%%") for arg in login[:-1]]
        options += ["-o", "ProxyCommand=" + " ".join([*inner, "-W", "'[%h]:%p'", shlex.quote(login[-1])])]
    return options


def connection_vars(cluster: Cluster, pool: OnPremPool) -> dict[str, Any]:
    """The pool's connection variables (ansible-core's ssh connection plugin:
    docs.ansible.com/ansible/latest/plugins/connection/ssh.html, variables
    ansible_user, ansible_port, ansible_ssh_private_key_file,
    ansible_host_key_checking); left out where ssh's or Ansible's default applies."""
    ssh = cluster.ssh_for(pool)
    found = {
        # Beats ANSIBLE_HOST_KEY_CHECKING=False in an operator's environment:
        # inventory variables outrank the environment for this option.
        "ansible_host_key_checking": True,
        "ansible_user": ssh.user,
        "ansible_port": ssh.port,
        "ansible_ssh_private_key_file": ssh.private_key_file,
        # The roles install packages and manage units as root; a site's login is a user
        # with passwordless sudo (docs/onprem-hosts.md, doctor checks `sudo -n`), so every
        # task runs through sudo, Ansible's default become method. ansible_become is the
        # host-level switch (docs.ansible.com, playbook_guide/playbooks_privilege_escalation:
        # become connection variables); tasks delegated to the controller use the
        # controller's own variables, so they stay unprivileged.
        "ansible_become": True if ssh.user != "root" else None,
    }
    return {key: value for key, value in found.items() if value is not None}


def host_vars(cluster: Cluster, pool: OnPremPool, options: list[str]) -> dict[str, dict[str, Any]]:
    """Each host's own connection variables: its address, and its ssh options
    with HostKeyAlias, so ssh looks its key up under its inventory name however
    it is reached (HostKeyAlias takes no %-tokens: one value per host).
    ansible_ssh_common_args, not ..._extra_args: scp and sftp need it too."""
    found = {}
    pool_labels = cluster.node_labels(pool)
    for host in pool.host_names:
        found[host] = {"ansible_ssh_common_args": shlex.join([*options, "-o", f"HostKeyAlias={host}"])}
        if host in pool.host_addresses:
            found[host]["ansible_host"] = pool.host_addresses[host]
        if pool.racks and host in pool.host_racks:
            # A host variable replaces the pool group's corral_node_labels
            # whole (Ansible does not merge dicts across groups and hosts by
            # default, hash_behaviour=replace), so it carries the pool's labels
            # plus the host's rack. The kubelet registers with it (kubelet_join,
            # --node-labels); NodeRestriction lets a kubelet set corral.dev/
            # labels, it refuses only node-restriction.kubernetes.io/ and most
            # kubernetes.io/k8s.io ones (policy.NODE_RESTRICTION_PREFIX).
            found[host]["corral_node_labels"] = pool_labels | {RACK_LABEL: pool.host_racks[host]}
    return found


def build(cluster: Cluster) -> dict[str, Any]:
    """Ansible's JSON inventory format (the dynamic-inventory `--list` answer).

    Variable values are Unsafe strings: serialise with `to_ansible_json` or
    `to_ansible_yaml`, which keep the mark (plain json.dumps would drop it).
    """
    inventory: dict[str, Any] = {
        "_meta": {"hostvars": {}},
        "all": {"children": ["onprem_nodes"], "vars": mark_unsafe(cluster_vars(cluster))},
        "onprem_nodes": {"children": [], "hosts": []},
        "gpu_nodes": {"hosts": []},
        "roce_nodes": {"hosts": []},
    }
    for pool in cluster.onprem_pools:
        hosts = pool.host_names
        pool_group = group_name("pool", pool.name)
        site_group = group_name("site", pool.site)
        inventory[pool_group] = {"hosts": hosts, "vars": mark_unsafe({**pool_vars(cluster, pool),
                                                                      **connection_vars(cluster, pool)})}
        inventory["_meta"]["hostvars"].update(mark_unsafe(host_vars(cluster, pool, pool_ssh_options(cluster, pool))))
        site = inventory.setdefault(site_group, {"hosts": [], "vars": mark_unsafe(site_vars(cluster, pool.site))})
        site["hosts"].extend(hosts)
        inventory["onprem_nodes"]["hosts"].extend(hosts)
        if pool.gpu:
            inventory["gpu_nodes"]["hosts"].extend(hosts)
        if pool.roce:
            inventory["roce_nodes"]["hosts"].extend(hosts)
    return inventory


def host_pool(cluster: Cluster) -> dict[str, str]:
    """Host name -> pool name, for every on-prem host."""
    return {host: pool.name for pool in cluster.onprem_pools for host in pool.host_names}


def as_yaml_inventory(data: dict[str, Any]) -> dict[str, Any]:
    """The same inventory in Ansible's YAML inventory shape (hosts as mappings,
    each host's own variables under its first group, onprem_nodes)."""
    hostvars = data["_meta"]["hostvars"]
    children = {}
    for group, body in data.items():
        if group in ("_meta", "all"):
            continue
        entry: dict[str, Any] = {"hosts": {host: (hostvars.get(host) if group == "onprem_nodes" else None)
                                           for host in body.get("hosts", [])}}
        if body.get("vars"):
            entry["vars"] = body["vars"]
        children[group] = entry
    return {"all": {"vars": data["all"]["vars"], "children": children}}
