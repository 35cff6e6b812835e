"""Kubelet reservations and NUMA alignment (corral.machine.kubelet_reservations).

The script every kubelet machine runs before kubeadm is run with bash against
fake /proc/meminfo, CPU counts and NUMA folders; its kubeadm patch is checked
against GKE's published tiers computed here independently; the cloud roles,
the kubeadm configurations, the on-prem roles (the same template, rendered by
Ansible) and `kubeadm upgrade node --patches` are checked to carry it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

from corral.machine import kubelet_reservations as kr
from corral.machine.api_server import (
    render_kubeadm_init_config,
    render_kubeadm_join_config,
)
from corral.machine.cloud_init import (
    render_api_server_cloud_init,
    render_pool_cloud_init,
)
from corral.machine.kubeadm import JoinToken
from corral.machine.secret_fetch import SecretRef
from corral.model import load_fleet
from corral.model.layout import layout
from corral.nodes.inventory import mark_unsafe, to_ansible_json

from .conftest import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "corral" / "templates" / kr.TEMPLATE
GIB_KIB = 1024 * 1024


def example(name: str):
    return load_fleet([EXAMPLES]).clusters[name]


def gpu_pool(cluster, count: int | None = None):
    return next(p for p in cluster.node_pools if p.gpu and (count is None or p.gpu.count == count))


# --- GKE's tiers, computed here from the published table ----------------------------
# cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes (memory and CPU
# reservations): "255 MiB of memory for machines with less than 1 GiB of memory",
# 25 % of the first 4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of the next
# 112, 2 % above 128 GiB; 6 % of the first core, 1 % of the next, 0.5 % of the next
# 2, 0.25 % of any cores above 4.
def gke_memory_mib(mem_mib: int) -> int:
    if mem_mib < 1024:
        return 255
    tiers = [(4096, 0.25), (4096, 0.20), (8192, 0.10), (114688, 0.06), (math.inf, 0.02)]
    left, total = mem_mib, 0.0
    for size, share in tiers:
        part = min(left, size)
        total += part * share
        left -= part
    return math.ceil(round(total, 6))


def gke_cpu_millicores(cpus: int) -> int:
    tiers = [(1, 60), (1, 10), (2, 5), (math.inf, 2.5)]
    left, total = cpus, 0.0
    for size, per_core in tiers:
        part = min(left, size)
        total += part * per_core
        left -= part
    return math.ceil(total)


def test_the_tiers_here_match_gkes_own_examples():
    # GKE's n1-standard-2 (2 vCPU): 70 millicores; 16 cores: 110m (both quoted with the table).
    assert gke_cpu_millicores(2) == 70 and gke_cpu_millicores(16) == 110
    # 150 GiB: 9.76 GiB reserved (GKE's table; gke-node-allocatable-memory-calculator says
    # 9.8577 GiB with the 100 MiB eviction threshold).
    assert abs(gke_memory_mib(150 * 1024) / 1024 - (9.8577 - 100 / 1024)) < 0.001


# --- The script itself, run with bash -----------------------------------------------
def run_script(tmp_path: Path, values: dict, mem_kib: int, cpus: int, numa_nodes: int = 1, name: str = "a"):
    """Render the script for `values` and run it on a fake machine; (result, patch dict)."""
    work = tmp_path / name
    patches = work / "patches"
    values = dict(values, patches_dir=str(patches), patch_path=str(patches / "kubeletconfiguration+merge.yaml"))
    script = work / "corral-kubelet-reservations"
    work.mkdir(parents=True, exist_ok=True)
    script.write_text(kr.render_script(values))
    meminfo = work / "meminfo"
    meminfo.write_text(f"MemTotal:       {mem_kib} kB\nMemFree:        1024 kB\nMemAvailable:   2048 kB\n")
    sysfs = work / "node"
    for node in range(numa_nodes):
        (sysfs / f"node{node}").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CORRAL_MEMINFO=str(meminfo), CORRAL_CPUS=str(cpus), CORRAL_NODE_SYSFS=str(sysfs))
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=30, check=False)
    patch_file = Path(values["patch_path"])
    patch = yaml.safe_load(patch_file.read_text()) if patch_file.exists() else None
    return result, patch


MACHINES = [
    # (MemTotal kB, CPUs): a tiny VM, e2-standard-4, n2-standard-16, an API server,
    # p4d/a2-highgpu-8g-sized, a 2 TiB H100 node.
    (900 * 1024, 1),
    (16 * GIB_KIB - 300 * 1024, 4),
    (64 * GIB_KIB - 700 * 1024, 16),
    (150 * GIB_KIB, 48),
    (1152 * GIB_KIB, 96),
    (2016 * GIB_KIB, 224),
]


@pytest.mark.parametrize(("mem_kib", "cpus"), MACHINES)
def test_api_servers_and_cpu_pools_reserve_gkes_tiers_and_evict_at_one_percent(tmp_path, mem_kib, cpus):
    result, patch = run_script(tmp_path, kr.context(None), mem_kib, cpus, numa_nodes=2)
    assert result.returncode == 0, result.stderr
    mem_mib = mem_kib // 1024
    assert patch["kubeReserved"] == {"cpu": f"{gke_cpu_millicores(cpus)}m", "memory": f"{gke_memory_mib(mem_mib)}Mi"}
    # Every hard threshold: one set leaves the unset ones at zero (kubernetes.io,
    # node-pressure eviction); memory.available 1 %, never below the kubelet's 100Mi.
    assert patch["evictionHard"] == {
        "memory.available": f"{max(100, math.ceil(mem_mib / 100))}Mi",
        "nodefs.available": "10%", "nodefs.inodesFree": "5%", "imagefs.available": "15%",
    }
    # No GPUs: no system reservation, no CPU or topology manager.
    assert set(patch) == {"kubeReserved", "evictionHard"}
    assert "written to" in result.stdout


@pytest.mark.parametrize(("mem_kib", "cpus"), MACHINES[3:])
def test_gpu_nodes_reserve_for_the_nvidia_host_side_and_align_numa(tmp_path, mem_kib, cpus):
    pool = gpu_pool(example("jaguar"), 8)
    result, patch = run_script(tmp_path, kr.context(pool), mem_kib, cpus, numa_nodes=2)
    assert result.returncode == 0, result.stderr
    assert patch["kubeReserved"]["memory"] == f"{gke_memory_mib(mem_kib // 1024)}Mi"
    assert patch["systemReserved"] == {"cpu": "1000m", "memory": f"{1024 + 8 * 256}Mi"}
    assert patch["cpuManagerPolicy"] == "static"
    assert patch["topologyManagerPolicy"] == "best-effort"
    assert patch["topologyManagerScope"] == "pod"
    # The static policy needs a CPU reservation greater than zero (kubernetes.io,
    # Control CPU Management Policies): kube + system reserved CPU.
    reserved = int(patch["kubeReserved"]["cpu"].rstrip("m")) + int(patch["systemReserved"]["cpu"].rstrip("m"))
    assert reserved > 1000


def test_every_gpu_pool_aligns_numa_and_no_other_machine_does():
    for cluster in load_fleet([EXAMPLES]).clusters.values():
        for pool in cluster.node_pools:
            values = kr.context(pool)
            assert values["numa_alignment"] is (pool.gpu is not None), pool.name
            assert values["gpu_count"] == (pool.gpu.count if pool.gpu else 0)
    assert kr.context(None)["numa_alignment"] is False


def test_values_the_kubelet_accepts():
    # kubelet-config.v1beta1: topologyManagerPolicy in {restricted, best-effort, none,
    # single-numa-node}, topologyManagerScope in {container, pod}, cpuManagerPolicy none/static.
    for pool in (None, gpu_pool(example("jaguar"))):
        values = kr.context(pool)
        assert values["topology_manager_policy"] in {"restricted", "best-effort", "none", "single-numa-node"}
        assert values["topology_manager_scope"] in {"container", "pod"}
        assert values["cpu_manager_policy"] in {"none", "static"}
    # kubeadm's patch file name: target[suffix][+patchtype].extension.
    assert re.fullmatch(r"kubeletconfiguration[^+]*\+(strategic|merge|json)\.(yaml|json)", Path(kr.PATCH_FILE).name)


def test_more_numa_nodes_than_the_topology_manager_allows_keeps_it_off(tmp_path):
    result, patch = run_script(tmp_path, kr.context(gpu_pool(example("jaguar"))), 2016 * GIB_KIB, 224, numa_nodes=16)
    assert result.returncode == 0, result.stderr
    # The kubelet refuses a topology manager on more than 8 NUMA nodes; the CPU manager stays.
    assert "topologyManagerPolicy" not in patch and "topologyManagerScope" not in patch
    assert patch["cpuManagerPolicy"] == "static"
    assert "16 NUMA nodes" in result.stderr


def test_a_second_run_leaves_the_patch_alone_and_no_temporary_file(tmp_path):
    values = kr.context(gpu_pool(example("jaguar")))
    first, _ = run_script(tmp_path, values, 1152 * GIB_KIB, 96, numa_nodes=2)
    patch_file = tmp_path / "a" / "patches" / "kubeletconfiguration+merge.yaml"
    before = patch_file.stat().st_mtime_ns
    second, _ = run_script(tmp_path, values, 1152 * GIB_KIB, 96, numa_nodes=2)
    assert first.returncode == second.returncode == 0
    assert " unchanged " in second.stdout  # what kubelet_join's changed_when reads
    assert patch_file.stat().st_mtime_ns == before
    # kubeadm reads every file in the folder: only the patch is left there.
    assert [p.name for p in patch_file.parent.iterdir()] == [patch_file.name]


def test_no_meminfo_fails_the_boot_instead_of_writing_a_patch(tmp_path):
    values = kr.context(None)
    result, patch = run_script(tmp_path, values, 0, 4)
    assert result.returncode != 0 and patch is None
    assert "no MemTotal" in result.stderr


def test_strings_the_script_would_take_literally_are_refused():
    with pytest.raises(ValueError, match="policy name"):
        kr.render_script(dict(kr.context(None), topology_manager_policy="none'; rm -rf /; '"))
    with pytest.raises(ValueError, match="plain path"):
        kr.render_script(dict(kr.context(None), patch_path="/etc/kubernetes/patches/$(id)"))


# --- Wiring: cloud machines ------------------------------------------------------------
REF = SecretRef("aws", "store", "role")


def cloud_config(document: str) -> tuple[dict, list[str]]:
    data = yaml.safe_load(document)
    return {f["path"]: f["content"] for f in data["write_files"]}, data["runcmd"]


@pytest.mark.parametrize("name", ["heron", "ibis", "jaguar"])
def test_every_cloud_kubelet_machine_sizes_its_reservations_before_kubeadm(name):
    cluster = example(name)
    lay = layout(cluster)
    for pool in cluster.cloud_pools:
        files, commands = cloud_config(render_pool_cloud_init(cluster, lay, pool, REF))
        assert commands.index(kr.SCRIPT) < commands.index("/usr/local/sbin/corral-pool-node")
        assert files[kr.SCRIPT] == kr.render_script(kr.context(pool))
        join = yaml.safe_load(files["/etc/kubernetes/kubeadm/join.yaml"])
        assert join["patches"] == {"directory": kr.PATCHES_DIR}
    files, commands = cloud_config(render_api_server_cloud_init(cluster, lay, 1, REF))
    assert commands.index(kr.SCRIPT) < commands.index("/usr/local/sbin/corral-api-server")
    # API servers: reservations, no static CPU manager.
    assert files[kr.SCRIPT] == kr.render_script(kr.context(None))
    assert "NUMA_ALIGNMENT=0" in files[kr.SCRIPT]
    # kubeadm init and the control-plane join both apply the patch folder.
    init = next(d for d in yaml.safe_load_all(render_kubeadm_init_config(cluster, lay, [JoinToken("a" * 6 + "." + "b" * 16, "x")]))
                if d["kind"] == "InitConfiguration")
    assert init["patches"] == {"directory": kr.PATCHES_DIR}
    assert yaml.safe_load(render_kubeadm_join_config(cluster, lay, 1))["patches"] == {"directory": kr.PATCHES_DIR}


def test_gpu_pool_scripts_align_numa_and_cpu_pool_scripts_do_not():
    cluster = example("heron")
    lay = layout(cluster)
    for pool in cluster.cloud_pools:
        files, _ = cloud_config(render_pool_cloud_init(cluster, lay, pool, REF))
        assert (f"NUMA_ALIGNMENT={1 if pool.gpu else 0}") in files[kr.SCRIPT]
        assert (f"GPU_COUNT={pool.gpu.count if pool.gpu else 0}") in files[kr.SCRIPT]


# --- On-prem: the same template, rendered by Ansible -----------------------------------
def render_plain(values: dict, **env_opts) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)),
                             undefined=jinja2.StrictUndefined, **env_opts)
    return env.get_template(TEMPLATE.name).render(reservations=values)


def test_template_is_identical_under_every_whitespace_setting():
    values = kr.context(gpu_pool(example("jaguar")))
    outs = {render_plain(values, trim_blocks=t, lstrip_blocks=lb, keep_trailing_newline=True)
            for t, lb in itertools.product([False, True], repeat=2)}
    assert outs == {kr.render_script(values)}


def test_ansible_renders_the_inventorys_values_into_the_same_script(tmp_path):
    """kubelet_join's template task, with the inventory's (unsafe-marked) values."""
    values = kr.context(gpu_pool(example("jaguar")))
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps({"reservations": to_ansible_json(mark_unsafe(values))}))
    dest = tmp_path / "script"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible" / "ansible.cfg"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    result = subprocess.run(
        ["ansible", "localhost", "-c", "local", "-m", "ansible.builtin.template",
         "-a", f"src={TEMPLATE} dest={dest}", "-e", f"@{vars_file}"],
        cwd=ROOT / "ansible", env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    if result.returncode != 0 and "No module named" in result.stderr:
        pytest.skip("ansible-core not installed")
    assert result.returncode == 0, result.stdout + result.stderr
    assert dest.read_text() == kr.render_script(values)


def _tasks(path: Path) -> list[dict]:
    def walk(items):
        for task in items or []:
            yield task
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key))
    return list(walk(yaml.safe_load(path.read_text())))


def _argv(task: dict, **variables) -> list[str]:
    """A task's `argv: {{ ... }}` evaluated with plain jinja2 (the expression uses no Ansible filters)."""
    text = task["ansible.builtin.command"]["argv"].strip()
    assert text.startswith("{{") and text.endswith("}}")
    return jinja2.Environment().compile_expression(text[2:-2])(**variables)


def test_on_prem_join_writes_the_patch_before_joining_and_names_its_folder():
    tasks = _tasks(ROOT / "ansible/roles/kubelet_join/tasks/main.yml")
    names = [t.get("name") for t in tasks]
    include = names.index("Size this host's kubelet reservations")
    assert tasks[include]["ansible.builtin.include_tasks"] == "reservations.yml"
    join = names.index("Join the cluster with kubeadm")
    render = next(i for i, t in enumerate(tasks) if (t.get("ansible.builtin.template") or {}).get("src") == "{{ corral_join_template }}")
    assert include < render < join
    assert "corral_kubelet_reservations.patches_dir" in tasks[render]["vars"]["patches_dir"]
    defaults = yaml.safe_load((ROOT / "ansible/roles/kubelet_join/defaults/main.yml").read_text())
    assert defaults["corral_kubelet_reservations_template"].endswith("corral/templates/" + kr.TEMPLATE)
    assert defaults["corral_kubelet_reservations_script"] == kr.SCRIPT


def test_kubeadm_upgrade_node_gets_the_patches_and_a_changed_cpu_policy_loses_its_checkpoint():
    tasks = _tasks(ROOT / "ansible/roles/kubelet_upgrade/tasks/main.yml")
    names = [t.get("name") for t in tasks]
    upgrade = tasks[names.index("Upgrade the node's kubelet configuration (kubeadm upgrade node)")]
    values = kr.context(gpu_pool(example("jaguar")))
    assert _argv(upgrade, corral_kubelet_reservations=values) == ["kubeadm", "upgrade", "node", "--patches", kr.PATCHES_DIR]
    assert _argv(upgrade, corral_kubelet_reservations=None) == ["kubeadm", "upgrade", "node"]
    # The patch is written again first; the stale checkpoint goes with the kubelet stopped,
    # before the restart.
    sized = names.index("Size this host's kubelet reservations (kubeadm upgrade node re-applies them)")
    assert tasks[sized]["ansible.builtin.include_role"] == {"name": "kubelet_join", "tasks_from": "reservations.yml"}
    stop = names.index("Stop the kubelet (the checkpoint must not be rewritten while it goes)")
    remove = names.index("Remove the CPU manager checkpoint (the kubelet starts a new one with its policy)")
    restart = names.index("Restart the kubelet on the new version and configuration")
    assert sized < names.index("Upgrade the node's kubelet configuration (kubeadm upgrade node)") < stop < remove < restart
    defaults = yaml.safe_load((ROOT / "ansible/roles/kubelet_upgrade/defaults/main.yml").read_text())
    assert tasks[remove]["ansible.builtin.file"] == {"path": "{{ corral_cpu_manager_state_file }}", "state": "absent"}
    assert defaults["corral_cpu_manager_state_file"] == "/var/lib/kubelet/cpu_manager_state"


def test_the_inventory_gives_on_prem_pools_the_cloud_nodes_inputs():
    from corral.nodes.inventory import build

    jaguar = example("jaguar")
    inventory = build(jaguar)
    for pool in jaguar.onprem_pools:
        got = inventory[f"pool_{pool.name}".replace("-", "_")]["vars"]["corral_kubelet_reservations"]
        assert got == kr.context(pool)
        assert got["numa_alignment"] is (pool.gpu is not None)
    # Its strings are unsafe-marked like every inventory value (Ansible takes them literally).
    gpu = inventory["pool_gpu_h100_sf1"]["vars"]["corral_kubelet_reservations"]
    assert type(gpu["patch_path"]).__name__ == "Unsafe"


CHECKPOINT_TASKS = (
    "Read the kubelet's configuration and its CPU manager checkpoint",
    "Compare the configured CPU manager policy with the checkpoint's",
    "Stop the kubelet and remove the CPU manager checkpoint of the old policy",
)


@pytest.mark.parametrize(("configured", "checkpoint", "removed"), [
    ("cpuManagerPolicy: static\n", "None", True),     # a GPU host joined before: none -> static
    ("cpuManagerPolicy: static\n", "static", False),
    ("cgroupDriver: systemd\n", "none", False),       # no policy configured: the kubelet's none
    ("cgroupDriver: systemd\n", "static", True),
    ("cpuManagerPolicy: static\n", None, False),      # no checkpoint yet: nothing to do
])
def test_kubelet_upgrade_removes_a_checkpoint_of_another_cpu_policy(tmp_path, configured, checkpoint, removed):
    """kubelet_upgrade's own tasks, run by Ansible on files in tmp_path (the kubelet stop is a no-op here)."""
    tasks = yaml.safe_load((ROOT / "ansible/roles/kubelet_upgrade/tasks/main.yml").read_text())
    chosen = [t for t in tasks if t.get("name") in CHECKPOINT_TASKS]
    assert [t["name"] for t in chosen] == list(CHECKPOINT_TASKS)
    for task in chosen[2]["block"]:
        if "ansible.builtin.systemd_service" in task:
            task.pop("ansible.builtin.systemd_service")
            task["ansible.builtin.debug"] = {"msg": "kubelet stopped"}
    config = tmp_path / "config.yaml"
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + configured)
    state = tmp_path / "cpu_manager_state"
    if checkpoint is not None:
        state.write_text(json.dumps({"policyName": checkpoint, "defaultCpuSet": "0-7", "checksum": 1}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"corral_kubelet_config_file": str(config), "corral_cpu_manager_state_file": str(state),
                 "_corral_kubeadm_upgrade": {"changed": True}, "ansible_python_interpreter": sys.executable},
        "tasks": chosen,
    }]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible" / "ansible.cfg"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    result = subprocess.run(["ansible-playbook", "-i", "localhost,", str(playbook)], cwd=ROOT / "ansible", env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0 and "No module named" in result.stderr:
        pytest.skip("ansible-core not installed")
    assert result.returncode == 0, result.stdout + result.stderr
    assert state.exists() is (checkpoint is not None and not removed), result.stdout
    assert ("kubelet stopped" in result.stdout) is removed
