"""Slow tier: the kernel-level roles on a real kernel (qemu under TCG).

The hostlab containers share the test machine's kernel, so `test_roles.py`
can only check the *files* node_base / arp_cache / flannel_host / roce
persist.  Here ONE Debian bookworm VM with its own kernel
(tests/hostlab/qemu.py) gets a small playbook with those four roles, the
inventory contract of ansible/README.md and a soft-RoCE link (`rdma_rxe`,
`rdma link add rxe0 type rxe netdev <nic>`, a pre-task) on the VM's virtio
NIC, with `corral_roce_apply: true`.  Then, for real: modules loaded
(`lsmod`), `gc_thresh*` in the kernel, the RDMA link ACTIVE, the NIC MTU,
the persisted unit/script, a second run with changed=0, and after a reboot
of the VM the persisted modules/sysctls/unit taking effect at boot.

Opt-in: `CORRAL_SLOW_TESTS=1 python -m pytest tests/ansible/test_roles_qemu.py -v`
(~5-10 minutes on 2 cores; the first run also builds the cached VM image,
~75 s).  Needs root, qemu-system-x86 and qemu-utils; see tests/hostlab/README.md.

Environment:
  CORRAL_SLOW_TESTS=1             run these tests (CI does not set it)
  CORRAL_HOSTLAB_CACHE            image cache (default /var/cache/corral-hostlab)
  CORRAL_ANSIBLE_TIMINGS=path     append wall times as JSON
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.ansible.recap import parse_recap

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"

_SLOW = os.environ.get("CORRAL_SLOW_TESTS") == "1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not _SLOW,
        reason="slow tier (qemu under TCG, ~5-10 min): set CORRAL_SLOW_TESTS=1 to run",
    ),
    pytest.mark.skipif(
        shutil.which("qemu-system-x86_64") is None,
        reason="qemu-system-x86_64 not found (apt-get install --no-install-recommends "
        "qemu-system-x86 qemu-utils)",
    ),
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="the qemu tier needs root (image build: chroot, mounts)",
    ),
]

HOST = "qemu-roce-001.lab1.internal"
GC_THRESH = {1: 81920, 2: 92160, 3: 102400}
ROCE_MTU = 9000
FLANNEL_MTU = 1450  # the NIC starts at 1500 (flannel_host runs before roce)
NODE_MODULES = ("br_netfilter", "overlay", "vxlan")

# The test pre-play creates the soft-RoCE device the roce role then finds
# (/sys/class/infiniband/rxe0 on the declared interface); it is changed only
# when it adds the link, so the second run can still be changed=0.  The other
# plays are playbooks/join.yml's "prepare" and "RoCE" plays.
PLAYBOOK = """\
- name: Soft-RoCE (rdma_rxe) on the VM NIC, standing in for a RoCE NIC
  hosts: roce_nodes
  gather_facts: false
  tasks:
    - name: Add rxe0 on {{ corral_roce_interfaces[0] }} unless present
      ansible.builtin.shell: |
        set -eu
        modprobe rdma_rxe
        if rdma link show rxe0/1 >/dev/null 2>&1; then echo present; exit 0; fi
        rdma link add rxe0 type rxe netdev {{ corral_roce_interfaces[0] | quote }}
        echo added
      register: _rxe
      changed_when: _rxe.stdout == 'added'

- name: Prepare the node base, neighbour tables and flannel host settings
  hosts: onprem_nodes
  gather_facts: true
  gather_subset: ['!all', 'min', 'network', 'virtual']
  roles:
    - role: node_base
    - role: arp_cache
    - role: flannel_host

- name: Configure RoCE QoS
  hosts: roce_nodes:&onprem_nodes
  gather_facts: true
  gather_subset: ['!all', 'min', 'network', 'virtual']
  roles:
    - role: roce
"""


def inventory(vm) -> dict:
    return {
        "all": {
            "vars": {
                # cluster
                "corral_cluster_name": "jaguar",
                "corral_kubernetes_version": "1.31.4",
                "corral_pod_cidr": "10.244.0.0/16",
                "corral_service_cidr": "10.96.0.0/12",
                "corral_flannel_backend": "vxlan",
                "corral_flannel_direct_routing": True,
                "corral_flannel_mtu": FLANNEL_MTU,
                "corral_flannel_port": 8472,
                "corral_flannel_vni": 1,
                **{f"corral_arp_gc_thresh{i}": v for i, v in GC_THRESH.items()},
            },
            "hosts": {HOST: vm.inventory_vars()},
            "children": {
                "onprem_nodes": {"hosts": {HOST: {}}},
                "roce_nodes": {"hosts": {HOST: {}}},
                "site_lab1": {
                    "hosts": {HOST: {}},
                    "vars": {
                        "corral_site": "lab1",
                        # qemu's user network
                        "corral_site_cidrs": ["10.0.2.0/24"],
                        "corral_apt_mirror": None,
                        "corral_http_proxy": None,
                    },
                },
                "pool_roce": {
                    "hosts": {HOST: {}},
                    "vars": {
                        "corral_pool": "roce",
                        "corral_gpu_model": None,
                        "corral_gpu_count": 0,
                        "corral_nvidia_driver_version": None,
                        "corral_nvidia_fabricmanager": False,
                        "corral_roce_interfaces": [vm.nic],
                        "corral_roce_mtu": ROCE_MTU,
                        "corral_roce_pfc_priority": 3,
                        "corral_roce_dscp": 26,
                        "corral_roce_ecn": True,
                        # virtio + rxe: force apply (auto would too: not a
                        # container, /sys/class/infiniband present)
                        "corral_roce_apply": True,
                        # virtio takes no DCB: soft-RoCE is ACTIVE without lossless QoS.
                        "corral_roce_require_dcb": False,
                        "corral_node_labels": {"corral.dev/pool": "roce"},
                        "corral_node_taints": [],
                    },
                },
            },
        }
    }


def run_playbook(workdir: Path, timeout: float = 1800) -> dict:
    env = dict(
        os.environ,
        # production settings (pipelining, smart gathering + jsonfile fact
        # cache), with the cache in the test's own directory
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(ANSIBLE_DIR / "roles"),
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(workdir / "facts"),
        ANSIBLE_LOCAL_TEMP=str(workdir / "tmp"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        # TCG is slow: give the connection room
        ANSIBLE_TIMEOUT="120",
    )
    argv = [
        "ansible-playbook",
        "-i",
        str(workdir / "inventory.yml"),
        str(workdir / "site.yml"),
    ]
    t0 = time.monotonic()
    res = subprocess.run(
        argv,
        cwd=ANSIBLE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    recap = parse_recap(res.stdout)
    return {
        "rc": res.returncode,
        "stdout": res.stdout,
        "stderr": res.stderr,
        "wall": time.monotonic() - t0,
        "recap": recap.get(HOST),
        "argv": argv,
    }


def explain(run: dict) -> str:
    return (
        f"$ {' '.join(run['argv'])}\nrc={run['rc']} wall={run['wall']:.1f}s recap={run['recap']}\n"
        f"--- stdout (tail) ---\n{run['stdout'][-15000:]}\n--- stderr ---\n{run['stderr'][-3000:]}"
    )


def changed_tasks(run: dict) -> list[str]:
    """Names of the tasks that reported `changed` (for idempotence failures)."""
    out, task = [], None
    for line in run["stdout"].splitlines():
        m = re.match(r"^TASK \[(.*)\]", line)
        if m:
            task = m[1]
        elif line.startswith("changed:") and task:
            out.append(task)
    return out


# Everything the tests look at, gathered once over ssh (the VM is slow).
PROBE = r"""
echo "== kernel"; uname -r
echo "== lsmod"; lsmod | awk 'NR > 1 {print $1}'
echo "== sysctl"
for k in net.ipv4.neigh.default.gc_thresh1 net.ipv4.neigh.default.gc_thresh2 \
         net.ipv4.neigh.default.gc_thresh3 net.ipv6.neigh.default.gc_thresh3 \
         net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables \
         net.bridge.bridge-nf-call-ip6tables net.ipv4.conf.all.rp_filter \
         fs.inotify.max_user_watches fs.inotify.max_user_instances; do
  printf '%s=%s\n' "$k" "$(sysctl -n "$k" 2>&1)"
done
echo "== rdma"; rdma link show 2>&1
echo "== mtu"; cat /sys/class/net/{nic}/mtu
echo "== files"
for f in /usr/local/sbin/corral-roce-qos /etc/systemd/system/corral-roce-qos.service \
         /etc/modules-load.d/90-corral.conf /etc/modules-load.d/91-corral-flannel.conf \
         /etc/sysctl.d/90-corral-node.conf /etc/sysctl.d/91-corral-arp-cache.conf; do
  if [ -x "$f" ]; then echo "$f exec"; elif [ -f "$f" ]; then echo "$f file"; else echo "$f missing"; fi
done
echo "== unit"
systemctl show corral-roce-qos.service -p UnitFileState -p ActiveState -p Result -p ExecMainStatus
echo "== journal"; journalctl -b -u corral-roce-qos.service --no-pager -o cat 2>&1 | tail -n 30
echo "== end"
"""


def probe(vm) -> dict[str, str]:
    out = vm.run(PROBE.replace("{nic}", vm.nic), check=False, timeout=300).stdout
    sections, cur = {}, None
    for line in out.splitlines():
        if line.startswith("== "):
            cur = line[3:].strip()
            sections[cur] = []
        elif cur:
            sections[cur].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def sysctls(state: dict) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in state["sysctl"].splitlines() if "=" in line
    )


@pytest.fixture(scope="module")
def qemu_run(tmp_path_factory):
    from tests.hostlab import qemu

    ok, reason = qemu.available()
    if not ok:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("ansible-qemu")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    image = qemu.QemuImage().ensure()
    timings["image"] = time.monotonic() - t0
    vm = qemu.VM(image, name="roles-qemu")
    try:
        vm.start()
        timings["boot"] = vm.timings["boot"]
        (workdir / "site.yml").write_text(PLAYBOOK)
        (workdir / "inventory.yml").write_text(json.dumps(inventory(vm), indent=2))
        runs = {"first": run_playbook(workdir)}
        after_first = probe(vm)
        runs["second"] = run_playbook(workdir)
        after_second = probe(vm)
        vm.reboot()
        after_reboot = probe(vm)
        timings.update({k: v["wall"] for k, v in runs.items()})
        timings["reboot"] = vm.timings["reboot"]
        timings = {k: round(v, 1) for k, v in timings.items()}
        print(
            f"\nqemu tier timings (s): {timings}; image build: "
            f"{ {k: round(v, 1) for k, v in image.timings.items()} }; nic: {vm.nic}"
        )
        if os.environ.get("CORRAL_ANSIBLE_TIMINGS"):
            with open(os.environ["CORRAL_ANSIBLE_TIMINGS"], "a") as fh:
                fh.write(json.dumps({"qemu": timings}) + "\n")
        yield {
            "vm": vm,
            "runs": runs,
            "first": after_first,
            "second": after_second,
            "reboot": after_reboot,
            "timings": timings,
            "nic": vm.nic,
        }
    finally:
        vm.stop()


# ------------------------------------------------------------------ the runs


def test_first_run_succeeds(qemu_run):
    run = qemu_run["runs"]["first"]
    assert run["rc"] == 0 and run["recap"] and run["recap"]["failed"] == 0, explain(run)
    assert run["recap"]["changed"] > 0, explain(run)


def test_second_run_changes_nothing(qemu_run):
    run = qemu_run["runs"]["second"]
    assert run["rc"] == 0 and run["recap"], explain(run)
    assert run["recap"]["changed"] == 0, (
        f"not idempotent on a real kernel: changed tasks {changed_tasks(run)}\n"
        + explain(run)
    )


@pytest.mark.parametrize("when", ["first", "second"])
def test_rdma_check_passes_without_waiting(qemu_run, when):
    """The role's ACTIVE check recognises the link at once (rxe is ACTIVE as
    soon as it exists): a retry here means the check cannot read `rdma`'s
    answer and only the final failure test would catch a down link."""
    run = qemu_run["runs"][when]
    retries = [line for line in run["stdout"].splitlines()
               if "RETRYING" in line and "Wait for the RDMA links" in line]
    assert "TASK [roce : Wait for the RDMA links to be ACTIVE]" in run["stdout"], explain(run)
    assert retries == [], explain(run)


# ------------------------------------------------ kernel state after the run


@pytest.mark.parametrize("when", ["first", "second"])
def test_kernel_modules_loaded(qemu_run, when):
    loaded = set(qemu_run[when]["lsmod"].split())
    assert set(NODE_MODULES) <= loaded, f"lsmod after the {when} run: {sorted(loaded)}"


@pytest.mark.parametrize("when", ["first", "second"])
def test_neighbour_table_sizes_applied(qemu_run, when):
    s = sysctls(qemu_run[when])
    for i, want in GC_THRESH.items():
        assert s[f"net.ipv4.neigh.default.gc_thresh{i}"] == str(want), s
    assert s["net.ipv6.neigh.default.gc_thresh3"] == str(GC_THRESH[3]), s


def test_node_sysctls_applied(qemu_run):
    s = sysctls(qemu_run["first"])
    assert s["net.ipv4.ip_forward"] == "1", s
    # only exists once br_netfilter is loaded: proves the module-then-sysctl order
    assert s["net.bridge.bridge-nf-call-iptables"] == "1", s
    assert s["net.bridge.bridge-nf-call-ip6tables"] == "1", s
    assert s["net.ipv4.conf.all.rp_filter"] == "2", s
    assert s["fs.inotify.max_user_watches"] == "524288", s
    assert s["fs.inotify.max_user_instances"] == "8192", s


@pytest.mark.parametrize("when", ["first", "second"])
def test_rdma_link_active(qemu_run, when):
    rdma = qemu_run[when]["rdma"]
    assert re.search(
        rf"^link rxe0/1 state ACTIVE .*netdev {re.escape(qemu_run['nic'])}\b",
        rdma,
        re.MULTILINE,
    ), rdma


@pytest.mark.parametrize("when", ["first", "second"])
def test_roce_mtu_applied(qemu_run, when):
    assert qemu_run[when]["mtu"].strip() == str(ROCE_MTU), (
        f"{qemu_run['nic']} MTU after the {when} run: {qemu_run[when]['mtu']!r}"
    )


def test_persisted_files(qemu_run):
    files = dict(
        line.rsplit(" ", 1) for line in qemu_run["first"]["files"].splitlines()
    )
    assert files["/usr/local/sbin/corral-roce-qos"] == "exec", files
    for f, kind in files.items():
        assert kind in ("file", "exec"), f"{f} is {kind}"


def test_roce_unit_ran_successfully(qemu_run):
    """The QoS unit (script: MTU, dcb trust/PFC/app, ECN sysfs) ran and succeeded."""
    state = qemu_run["first"]
    assert "UnitFileState=enabled" in state["unit"], state["unit"]
    assert (
        "ActiveState=active" in state["unit"] and "Result=success" in state["unit"]
    ), f"{state['unit']}\n--- journal ---\n{state['journal']}"


# ---------------------------------------------------------------- after a reboot


def test_after_reboot_modules_and_sysctls_persist(qemu_run):
    """systemd-modules-load and systemd-sysctl apply the persisted files at boot."""
    state = qemu_run["reboot"]
    loaded = set(state["lsmod"].split())
    assert set(NODE_MODULES) <= loaded, sorted(loaded)
    s = sysctls(state)
    assert s["net.ipv4.neigh.default.gc_thresh3"] == str(GC_THRESH[3]), s
    assert s["net.bridge.bridge-nf-call-iptables"] == "1", s
    assert s["fs.inotify.max_user_watches"] == "524288", s


def test_after_reboot_roce_unit(qemu_run):
    """After a reboot rxe0 is gone (the soft-RoCE link is runtime state, like a
    NIC whose RDMA driver is not loaded yet), so the unit's
    ConditionPathIsDirectory=/sys/class/infiniband may skip it; it must not fail."""
    unit = qemu_run["reboot"]["unit"]
    assert "UnitFileState=enabled" in unit, unit
    assert "Result=success" in unit, f"{unit}\n{qemu_run['reboot']['journal']}"
