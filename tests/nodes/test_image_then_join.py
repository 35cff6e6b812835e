"""A node image baked with node-images/image.yml, then a machine booted from it joined by `corral join`.

On real throwaway hosts (systemd-nspawn, tests/hostlab), with the lab's signed
apt repository of test fakes standing in for NVIDIA's and Kubernetes'
repositories:

1. image.yml runs against a fresh host, as Packer runs it against a build VM
   (no GPUs to check, no join material, no cluster MTU); a second run
   changes nothing;
2. that host is stopped and a new host boots from a copy of its disk: a
   machine booted from the image, with its own name, address and keys;
3. `corral join` joins it, and - for comparison - a bare host of the same
   pool. The join after the image must change only the join itself.

The figures (changed tasks, wall times) go to $CORRAL_IMAGE_JOIN_FIGURES
when set (docs/fleet.md quotes them; benchmarks/bench_join.py has the row).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

pytest.importorskip("testinfra")
import testinfra  # noqa: E402

from . import joinlab  # noqa: E402

pytestmark = pytest.mark.hostlab

BUILDER = "ij-build-001.sf1.internal"
FROM_IMAGE = "ij-gpu-001.sf1.internal"
BARE = "ij-gpu-002.sf1.internal"

# What a join may still change on a machine booted from the image: the join
# itself, and what only the cluster file knows for this machine's pool - which
# no image can carry, since one image serves every pool and cluster. Anything
# else changed (a package, a runtime setting, a unit of a role) means the image
# missed it. Tasks that handle the bootstrap token are no_log: their results
# (and so their "changed") are censored in the events and cannot show here.
JOIN_ONLY_TASKS = {
    # The join: kubelet_join's token folder (the JoinConfiguration itself
    # and kubeadm join are no_log).
    "Create the root-only folder for the JoinConfiguration (on tmpfs)",
    "Remove the JoinConfiguration (it holds the bootstrap token)",
    # The converge check and record, `corral join`'s ad-hoc raw commands.
    "raw",
    # The cluster's neighbour-table sizes (docs/fleet.md: not in an image).
    "Persist sysctls in /etc/sysctl.d/91-corral-arp-cache.conf",
    # The pool's RoCE QoS for its NICs, PFC priority and DSCP.
    "Render the RoCE QoS script",
    "Install the RoCE QoS systemd unit (runs the script at every boot)",
    "Enable the RoCE QoS unit",
    # This machine's kubelet reservations, sized from its own memory and CPUs
    # (an image is built on another machine) into the kubeadm patch.
    "Install the kubelet reservations script (the template cloud nodes run too)",
    "Size this host's kubelet reservations (kubeadm patch)",
    # The pool's GPU preflight expectations (model, count, driver).
    "Install the preflight script (the template cloud nodes run too)",
    "Install the preflight unit (runs at every boot, so a reboot re-checks the node)",
    "Enable the preflight unit",
}


def timed_join(setup, host: str) -> dict:
    before = joinlab.artifact_dirs(setup)
    t0 = time.monotonic()
    result = subprocess.run(joinlab.corral_join_argv(setup, "--limit", host), env=joinlab.env_with(setup),
                            capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    runs = sorted(joinlab.artifact_dirs(setup) - before)
    return {"rc": result.returncode, "stdout": result.stdout, "stderr": result.stderr, "wall": wall,
            "changed": joinlab.changed_tasks(runs).get(host, [])}


@pytest.fixture(scope="module")
def image_then_join(hostlab, hostlab_repo, tmp_path_factory):
    lab, repo = hostlab, hostlab_repo
    workdir = tmp_path_factory.mktemp("image-then-join")
    hosts = []
    try:
        builder = lab.boot([BUILDER])[0]
        hosts.append(builder)
        image = joinlab.bake_image(lab, repo, builder, workdir)
        image_again = joinlab.bake_image(lab, repo, builder, workdir) if image["rc"] == 0 else None
        builder.stop()
        from_image = lab.boot_from(builder, FROM_IMAGE)
        hosts.append(from_image)
        bare = lab.boot([BARE])[0]
        hosts.append(bare)
        setup = joinlab.prepare(lab, repo, [from_image, bare], workdir, [FROM_IMAGE, BARE], [])
        joins = {FROM_IMAGE: timed_join(setup, FROM_IMAGE), BARE: timed_join(setup, BARE)}
        figures = {
            "image_build_s": round(image["wall"], 1),
            "image_rebuild_s": round(image_again["wall"], 1) if image_again else None,
            "join_after_image_s": round(joins[FROM_IMAGE]["wall"], 1),
            "join_bare_s": round(joins[BARE]["wall"], 1),
            "changed_after_image": joins[FROM_IMAGE]["changed"],
            "changed_bare": len(joins[BARE]["changed"]),
        }
        print(f"\nimage then join: {json.dumps(figures, indent=1)}")
        if os.environ.get("CORRAL_IMAGE_JOIN_FIGURES"):
            with open(os.environ["CORRAL_IMAGE_JOIN_FIGURES"], "a") as fh:
                fh.write(json.dumps(figures) + "\n")
        yield {"image": image, "image_again": image_again, "joins": joins, "setup": setup,
               "builder": builder, "from_image": from_image}
    finally:
        joinlab.remove_hosts(lab, hosts)


def explain(run: dict) -> str:
    return f"rc={run['rc']}\n--- stdout ---\n{run['stdout'][-12000:]}\n--- stderr ---\n{run['stderr'][-4000:]}"


def test_image_playbook_builds_on_a_host_without_gpus_or_join_material(image_then_join):
    image = image_then_join["image"]
    assert image["rc"] == 0, explain(image)


def test_rebuilding_the_image_changes_nothing(image_then_join):
    again = image_then_join["image_again"]
    assert again is not None and again["rc"] == 0, explain(again or image_then_join["image"])
    assert " changed=0 " in again["stdout"], explain(again)


def test_image_carries_packages_not_the_cluster_or_a_join(image_then_join):
    root = image_then_join["builder"]
    # Stopped: read its disk (the overlay's upper layer holds what the image changed).
    upper = root.dir / "upper"
    assert not (upper / "etc/kubernetes/kubelet.conf").exists()
    assert not (upper / "etc/sysctl.d/91-corral-arp-cache.conf").exists()
    assert (upper / "etc/machine-id").read_text() == ""
    status = (upper / "var/lib/dpkg/status").read_text()
    for package in ("nvidia-driver", "nvidia-fabricmanager-550", "kubelet", "kubeadm", "nvidia-container-toolkit"):
        assert f"Package: {package}\nStatus: install ok installed" in status or \
               f"Package: {package}\nStatus: hold ok installed" in status, package
    wants = {link.name for link in (upper / "etc/systemd/system").rglob("*.service") if link.is_symlink()}
    for unit in ("nvidia-persistenced.service", "nvidia-fabricmanager.service"):
        assert unit in wants, f"{unit} is not enabled in the image (links: {sorted(wants)})"


def test_the_join_after_the_image_changes_only_the_join(image_then_join):
    join = image_then_join["joins"][FROM_IMAGE]
    assert join["rc"] == 0, explain(join)
    unexpected = [task for task in join["changed"] if task not in JOIN_ONLY_TASKS]
    assert not unexpected, f"the join after the image changed more than the join: {unexpected}"


def test_a_bare_host_of_the_same_pool_joins_too_and_changes_far_more(image_then_join):
    joins = image_then_join["joins"]
    assert joins[BARE]["rc"] == 0, explain(joins[BARE])
    assert len(joins[BARE]["changed"]) > 3 * len(joins[FROM_IMAGE]["changed"])


def test_the_node_from_the_image_runs_the_pools_driver_and_runtime(image_then_join):
    ssh_config = str(image_then_join["setup"].ssh_config)
    host = testinfra.get_host(f"ssh://{FROM_IMAGE}", ssh_config=ssh_config)
    assert host.package("nvidia-driver").version.startswith("550.127.05-")
    assert host.file("/etc/kubernetes/kubelet.conf").exists
    assert host.service("nvidia-persistenced").is_running
    assert 'default_runtime_name = "nvidia"' in host.file("/etc/containerd/config.toml").content_string
    # Its own identity, not the builder's.
    assert host.file("/etc/machine-id").content_string.strip() not in ("", None)
    assert host.run("hostname").stdout.strip() == FROM_IMAGE.split(".")[0]
