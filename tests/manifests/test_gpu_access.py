"""Which containers see GPUs: a team pod that asks for no GPU gets none, an allocated
pod gets exactly its GPUs, and the GPU monitors keep seeing every GPU.

The NVIDIA runtime is containerd's default on GPU nodes, so the NVIDIA container
toolkit decides what each container sees. `toolkit_devices` below follows its
decision as upstream writes it (github.com/NVIDIA/nvidia-container-toolkit,
internal/config/image/cuda_image.go `CUDA.VisibleDevices` and
`requestsFromMounts`, internal/config/image/privileged.go `IsPrivileged`):

1. if accept-nvidia-visible-devices-as-volume-mounts is on, the mounts whose
   host side is /dev/null and whose container side is under
   /var/run/nvidia-container-devices/ name the devices (`<id>` or `all`);
2. else, or if there are none, $NVIDIA_VISIBLE_DEVICES names them, but only
   for a privileged container (CAP_SYS_ADMIN in its bounding set) or while
   accept-nvidia-visible-devices-envvar-when-unprivileged is on.

The pods are the rendered DaemonSets, and team pods as Pod Security `baseline`
(the level the rendered team namespaces enforce) admits them, plus what the
device plugin adds at allocation under the rendered DEVICE_LIST_STRATEGY
(k8s-device-plugin internal/plugin/server.go: `envvar` sets
NVIDIA_VISIBLE_DEVICES to the GPUs' ids; `volume-mounts` mounts /dev/null at
/var/run/nvidia-container-devices/<id> and sets the variable to that root).
The node side is policy.NODE_RUNTIME_SETTINGS, the settings docs/addons.md
documents for /etc/nvidia-container-runtime/config.toml.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from corral.manifests import all_objects, policy, render
from corral.model import Cluster, load_fleet

from .test_cluster_policy import baseline_violations

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])
GPU_CLUSTERS = sorted(n for n, c in FLEET.clusters.items() if policy.gpu_pools(c))
PSA = "pod-security.kubernetes.io"
MOUNT_ROOT = "/var/run/nvidia-container-devices"
ENVVAR = "accept-nvidia-visible-devices-envvar-when-unprivileged"
VOLUME_MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts"
# The toolkit's own defaults (config.toml as the package ships it): what a node
# without corral's settings does.
TOOLKIT_DEFAULTS = {ENVVAR: True, VOLUME_MOUNTS: False}
# The GPUs on the node, by the id the device plugin hands out (uuid strategy).
NODE_GPUS = ("GPU-0", "GPU-1", "GPU-2", "GPU-3")
# CUDA and NGC images set NVIDIA_VISIBLE_DEVICES=all in the image itself.
IMAGE_ENV = {"NVIDIA_VISIBLE_DEVICES": "all"}
GPU_MONITORS = (
    "DaemonSet/kube-system/nvidia-device-plugin",
    "DaemonSet/corral-monitoring/dcgm-exporter",
    "DaemonSet/kube-system/corral-gpu-health",
)
LEVELS = ("privileged", "baseline", "restricted")


# --- the toolkit ------------------------------------------------------------------


def bounding_capabilities(container: dict) -> set[str]:
    """The container's bounding set as containerd builds it from the securityContext."""
    context = container.get("securityContext", {})
    if context.get("privileged"):
        return {"SYS_ADMIN", "ALL"}
    caps = {"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
            "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}
    capabilities = context.get("capabilities", {})
    if "ALL" in capabilities.get("drop", []):
        caps = set()
    caps -= set(capabilities.get("drop", []))
    return caps | set(capabilities.get("add", []))


def host_mounts(pod: dict, container: dict) -> list[tuple[str, str]]:
    """(host path, container path) of the container's hostPath mounts; other volumes'
    host side lives under /var/lib/kubelet, never /dev/null."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    out = []
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        source = volume["hostPath"]["path"] if "hostPath" in volume else f"/var/lib/kubelet/pods/x/{mount['name']}"
        out.append((source, mount["mountPath"]))
    return out


def toolkit_devices(env: dict[str, str], mounts: list[tuple[str, str]], caps: set[str],
                    node: dict[str, bool]) -> set[str]:
    """The GPUs the NVIDIA toolkit injects into a container (module docstring)."""
    if node[VOLUME_MOUNTS]:
        requested = set()
        for source, destination in mounts:
            destination = destination.rstrip("/")
            if source == "/dev/null" and destination.startswith(MOUNT_ROOT + "/"):
                requested.add(destination.removeprefix(MOUNT_ROOT + "/"))
        if requested:
            return expand(requested)
    variable = env.get("NVIDIA_VISIBLE_DEVICES", "")
    if not variable or variable in ("void", "none"):
        return set()
    if "SYS_ADMIN" in caps or node[ENVVAR]:
        return expand(set(variable.split(",")))
    return set()  # "Ignoring devices requested by environment variable(s) in unprivileged container"


def expand(requested: set[str]) -> set[str]:
    return set(NODE_GPUS) if "all" in requested else requested & set(NODE_GPUS)


def allocate(strategy: str, gpus: tuple[str, ...]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """What the device plugin's Allocate adds to a container holding `gpus`."""
    env: dict[str, str] = {}
    mounts: list[tuple[str, str]] = []
    for one in strategy.split(","):
        if one == "envvar":
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus)
        elif one == "volume-mounts":
            env["NVIDIA_VISIBLE_DEVICES"] = MOUNT_ROOT
            mounts += [("/dev/null", f"{MOUNT_ROOT}/{gpu}") for gpu in gpus]
        else:
            raise AssertionError(f"strategy {one} not modelled")
    return env, mounts


def sees(pod: dict, container: dict, strategy: str, node: dict[str, bool], allocated: tuple[str, ...] = ()) -> set:
    env = dict(IMAGE_ENV)
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    mounts = host_mounts(pod, container)
    if allocated:
        extra_env, extra_mounts = allocate(strategy, allocated)
        env.update(extra_env)
        mounts += extra_mounts
    return toolkit_devices(env, mounts, bounding_capabilities(container), node)


# --- the rendered cluster -------------------------------------------------------------


def objects(cluster: Cluster) -> dict[str, dict]:
    out = {}
    for obj in all_objects(render(cluster)):
        meta = obj["metadata"]
        out["/".join(p for p in (obj["kind"], meta.get("namespace"), meta["name"]) if p)] = obj
    return out


def device_list_strategy(rendered: dict[str, dict]) -> str:
    plugin = rendered["DaemonSet/kube-system/nvidia-device-plugin"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in plugin.get("env", [])}
    return env.get("DEVICE_LIST_STRATEGY", "envvar")  # the plugin's default (README)


def team_levels(cluster: Cluster, rendered: dict[str, dict]) -> dict[str, str]:
    return {ns: rendered[f"Namespace/{ns}"]["metadata"]["labels"][f"{PSA}/enforce"]
            for team in cluster.scheduling.teams for ns in team.namespaces}


def admitted(level: str, spec: dict) -> bool:
    """Whether Pod Security `level` admits the pod (the baseline checks; restricted is stricter)."""
    return level == "privileged" or not baseline_violations(spec)


def container(**context) -> dict:
    out = {"name": "train", "image": "nvcr.io/nvidia/pytorch:24.10-py3",
           "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    if context:
        out["securityContext"] = context
    return out


# What a team member might try in a pod that requests no GPU: each asks for
# every GPU one way the toolkit listens to.
ATTEMPTS = {
    "variable only": {"containers": [container()]},
    "variable, privileged": {"containers": [container(privileged=True)]},
    "variable, SYS_ADMIN": {"containers": [container(capabilities={"add": ["SYS_ADMIN"]})]},
    "mount of /dev/null": {
        "containers": [{**container(), "volumeMounts": [{"name": "gpus", "mountPath": f"{MOUNT_ROOT}/all"}]}],
        "volumes": [{"name": "gpus", "hostPath": {"path": "/dev/null"}}],
    },
    "mount of an emptyDir": {
        "containers": [{**container(), "volumeMounts": [{"name": "gpus", "mountPath": f"{MOUNT_ROOT}/all"}]}],
        "volumes": [{"name": "gpus", "emptyDir": {}}],
    },
}


@pytest.mark.parametrize("name", GPU_CLUSTERS)
def test_the_device_plugin_hands_out_gpus_as_volume_mounts(name):
    assert device_list_strategy(objects(FLEET.clusters[name])) == "volume-mounts"


def test_the_node_settings_refuse_the_variable_and_take_mounts():
    assert policy.NODE_RUNTIME_SETTINGS == {ENVVAR: False, VOLUME_MOUNTS: True}


@pytest.mark.parametrize("name", [n for n in GPU_CLUSTERS if FLEET.clusters[n].scheduling.teams])
@pytest.mark.parametrize("attempt", sorted(ATTEMPTS))
def test_a_team_pod_that_requests_no_gpu_sees_none(name, attempt):
    cluster = FLEET.clusters[name]
    rendered = objects(cluster)
    strategy, node = device_list_strategy(rendered), policy.NODE_RUNTIME_SETTINGS
    levels = team_levels(cluster, rendered)
    assert levels and all(level in ("baseline", "restricted") for level in levels.values()), levels
    spec = ATTEMPTS[attempt]
    for ns, level in levels.items():
        if admitted(level, spec):
            assert sees(spec, spec["containers"][0], strategy, node) == set(), (ns, attempt)


@pytest.mark.parametrize("name", GPU_CLUSTERS)
def test_a_pod_gets_exactly_the_gpus_it_was_allocated(name):
    rendered = objects(FLEET.clusters[name])
    strategy, node = device_list_strategy(rendered), policy.NODE_RUNTIME_SETTINGS
    spec = ATTEMPTS["variable only"]
    assert sees(spec, spec["containers"][0], strategy, node, allocated=("GPU-2",)) == {"GPU-2"}
    assert sees(spec, spec["containers"][0], strategy, node, allocated=("GPU-0", "GPU-3")) == {"GPU-0", "GPU-3"}


@pytest.mark.parametrize("name", GPU_CLUSTERS)
@pytest.mark.parametrize("monitor", GPU_MONITORS)
@pytest.mark.parametrize("settings", ["corral", "toolkit defaults"])
def test_gpu_monitors_see_every_gpu_within_their_namespace_level(name, monitor, settings):
    # Under corral's node settings, and under the toolkit's defaults (a node
    # not yet converged to them): the monitors must not depend on the order.
    rendered = objects(FLEET.clusters[name])
    node = policy.NODE_RUNTIME_SETTINGS if settings == "corral" else TOOLKIT_DEFAULTS
    daemonset = rendered[monitor]
    spec = daemonset["spec"]["template"]["spec"]
    ns = daemonset["metadata"]["namespace"]
    level = rendered[f"Namespace/{ns}"]["metadata"]["labels"][f"{PSA}/enforce"]
    assert admitted(level, spec), (monitor, level)
    agent = spec["containers"][0]
    assert sees(spec, agent, device_list_strategy(rendered), node) == set(NODE_GPUS), monitor


def test_the_device_plugin_needs_no_capability_to_see_the_gpus():
    spec = objects(FLEET.clusters["jaguar"])[GPU_MONITORS[0]]["spec"]["template"]["spec"]
    plugin = spec["containers"][0]
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert plugin["securityContext"]["allowPrivilegeEscalation"] is False
    assert "SYS_ADMIN" not in bounding_capabilities(plugin)


# --- the model itself: it tells the old setup from the new one ------------------------


def test_under_the_old_setup_a_team_pod_saw_every_gpu():
    # The device plugin's default strategy and the toolkit's default settings:
    # the hole this change closes.
    spec = ATTEMPTS["variable only"]
    assert sees(spec, spec["containers"][0], "envvar", TOOLKIT_DEFAULTS) == set(NODE_GPUS)


def test_envvar_strategy_under_corrals_settings_would_starve_allocated_pods():
    # Why the node settings and the plugin's strategy must change together.
    spec = ATTEMPTS["variable only"]
    assert sees(spec, spec["containers"][0], "envvar", policy.NODE_RUNTIME_SETTINGS, allocated=("GPU-1",)) == set()


def test_a_privileged_team_namespace_would_let_a_pod_take_every_gpu():
    cluster = FLEET.clusters["jaguar"]
    spec = copy.deepcopy(ATTEMPTS["variable, privileged"])
    assert admitted("privileged", spec)
    assert sees(spec, spec["containers"][0], "volume-mounts", policy.NODE_RUNTIME_SETTINGS) == set(NODE_GPUS)
    assert not admitted(policy.TEAM_POD_SECURITY, spec)
    assert cluster.scheduling.teams


# --- the node settings are documented ----------------------------------------------


def test_docs_name_the_node_settings_and_the_strategy():
    text = (ROOT / "docs" / "addons.md").read_text()
    for key, value in policy.NODE_RUNTIME_SETTINGS.items():
        assert re.search(rf"{re.escape(key)} = {str(value).lower()}\b", text), key
    assert f"DEVICE_LIST_STRATEGY={policy.DEVICE_LIST_STRATEGY}" in text
