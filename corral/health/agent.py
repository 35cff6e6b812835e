"""corral's GPU health agent: one pod per GPU node (DaemonSet `corral-gpu-health`).

Standard library only; it runs as it is from a ConfigMap in a stock Python
image, beside classify.py, with the node's kernel log, sysfs and the
preflight verdict's folder mounted from the host (docs/gpu-health.md).
Every `interval` seconds it:

1. reads the preflight verdict (/var/lib/corral/health/preflight.json); on
   cloud GPU nodes, which have no Ansible run, it runs the pool's preflight
   itself first. Only a verdict of the current boot counts, so a rebooted
   node is checked again. Pass: condition GPUPreflightPassed=True and the
   corral.dev/preflight taint removed. Fail: the condition with the
   verdict's reason and message, and a Warning event.
2. looks for faults: Xids and uncorrected PCIe errors in the kernel log,
   nvidia-smi's memory state and GPU count, inactive NVLinks on NVSwitch
   pools, RoCE ports not ACTIVE. Kernel-log faults stick until the node
   reboots (kept in a state file keyed by boot id: the ring buffer wraps).
3. writes the fault conditions and puts, changes or removes the
   corral.dev/unhealthy taint (NoExecute for fatal faults when the cluster
   file says so, NoSchedule otherwise), with an event when it changes.

It talks to the API server with its service account over HTTPS, patching
only its own node: a ValidatingAdmissionPolicy holds it to that node and to
corral.dev/ taints (the kubelet's own credential may not remove taints).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import classify  # noqa: E402  (beside this file in the ConfigMap)

PREFLIGHT_TAINT = "corral.dev/preflight"
UNHEALTHY_TAINT = "corral.dev/unhealthy"
POOL_LABEL = "corral.dev/pool"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# --- the decisions (pure) -------------------------------------------------


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def current_verdict(verdict: dict | None, boot_id: str | None) -> dict | None:
    """The verdict if it belongs to this boot (a reboot must pass again), else None."""
    if not verdict or not boot_id or verdict.get("boot_id") != boot_id:
        return None
    return verdict


def plan(node: dict, verdict: dict | None, faults: list, evict_on_fatal: bool, stamp: str) -> dict:
    """What to write to the node: {"conditions": [...], "taints": [...] or None, "events": [...]}.

    `taints` is None when they stay as they are. Conditions keep their last
    transition time unless their status changes.
    """
    old_conditions = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
    wanted: dict[str, tuple[str, str, str]] = dict(classify.conditions(faults))
    if verdict is None:
        wanted[classify.PREFLIGHT_CONDITION] = ("False", "PreflightPending", "no preflight verdict for this boot yet")
    else:
        wanted[classify.PREFLIGHT_CONDITION] = (
            "True" if verdict.get("passed") else "False", str(verdict.get("reason", "Unknown"))[:128],
            str(verdict.get("message", ""))[:1000])
    conditions, events = [], []
    for ctype, (status, reason, message) in sorted(wanted.items()):
        old = old_conditions.get(ctype, {})
        changed = old.get("status") != status
        conditions.append({
            "type": ctype, "status": status, "reason": reason, "message": message, "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp if changed or "lastTransitionTime" not in old else old["lastTransitionTime"],
        })
        if ctype == classify.PREFLIGHT_CONDITION and verdict is not None and (changed or old.get("reason") != reason):
            events.append(("Normal" if status == "True" else "Warning",
                           "GPUPreflightPassed" if status == "True" else "GPUPreflightFailed", message))
        elif ctype != classify.PREFLIGHT_CONDITION and status == "True" and (changed or old.get("reason") != reason):
            events.append(("Warning", reason, f"{ctype}: {message}"))

    taints = list(node.get("spec", {}).get("taints", []) or [])
    new = [t for t in taints if t.get("key") != UNHEALTHY_TAINT]
    if verdict is not None and verdict.get("passed"):
        new = [t for t in new if t.get("key") != PREFLIGHT_TAINT]
    elif verdict is not None and not any(t.get("key") == PREFLIGHT_TAINT for t in new):
        # This boot's preflight failed on a node without the taint (rebooted
        # by hand, or lifted before a remediation's reboot): behind it again.
        new.append({"key": PREFLIGHT_TAINT, "value": "failed", "effect": "NoSchedule"})
    effect = classify.taint_effect(faults, evict_on_fatal)
    if effect:
        worst = faults[0] if faults else None
        value = worst.condition if worst else "fault"
        new.append({"key": UNHEALTHY_TAINT, "value": value, "effect": effect, "timeAdded": stamp})
        old = next((t for t in taints if t.get("key") == UNHEALTHY_TAINT), None)
        if old and old.get("effect") == effect and old.get("value") == value:
            new[-1]["timeAdded"] = old.get("timeAdded", stamp)
    same = [(t.get("key"), t.get("value"), t.get("effect")) for t in taints] == \
           [(t.get("key"), t.get("value"), t.get("effect")) for t in new]
    if not same and effect:
        events.append(("Warning", "GPUUnhealthy", f"tainted {UNHEALTHY_TAINT}:{effect}"))
    if not same and not effect and any(t.get("key") == UNHEALTHY_TAINT for t in taints):
        events.append(("Normal", "GPUHealthy", f"{UNHEALTHY_TAINT} removed: no fault since boot"))
    return {"conditions": conditions, "taints": None if same else new, "events": events}


def sticky_faults(state: dict | None, boot_id: str, fresh: list) -> tuple[dict, list]:
    """Kernel-log faults of this boot, old and new (the ring buffer forgets; the node does not heal)."""
    kept = state.get("faults", []) if state and state.get("boot_id") == boot_id else []
    seen = {(f["condition"], f["reason"]) for f in kept}
    for fault in fresh:
        if (fault.condition, fault.reason) not in seen:
            kept.append({"condition": fault.condition, "reason": fault.reason, "message": fault.message,
                         "severity": fault.severity})
            seen.add((fault.condition, fault.reason))
    faults = [classify.Fault(f["condition"], f["reason"], f["message"], f["severity"]) for f in kept]
    return {"boot_id": boot_id, "faults": kept}, faults


def active_check_due(node: dict, pods: list, state: dict | None, now_epoch: float, active: dict) -> tuple[bool, str]:
    """Whether to run the active check (GPU burn, NCCL all-reduce) now, and why (not).

    Only on an idle node: no pod holds a GPU, it is in service (not cordoned,
    not behind either health taint), and the last check is `interval_seconds` old.
    """
    if not active.get("enabled"):
        return False, "active checks are off"
    last = (state or {}).get("last_run")
    if last is not None and now_epoch - last < active["interval_seconds"]:
        return False, "checked recently"
    keys = {t.get("key") for t in node.get("spec", {}).get("taints") or []}
    if UNHEALTHY_TAINT in keys or PREFLIGHT_TAINT in keys:
        return False, "already out of service (tainted)"
    if node.get("spec", {}).get("unschedulable"):
        return False, "cordoned"
    busy = classify.gpu_pods(pods)
    if busy:
        return False, f"GPUs in use by {', '.join(busy[:3])}"
    return True, "idle"


def active_state(state: dict | None, boot_id: str, now_epoch: float, faults: list) -> dict:
    """The active check's record: when it last ran, and its faults for this boot."""
    kept = state.get("faults", []) if state and state.get("boot_id") == boot_id else []
    return {"boot_id": boot_id, "last_run": now_epoch,
            "faults": kept + [{"condition": f.condition, "reason": f.reason, "message": f.message,
                               "severity": f.severity} for f in faults]}


def active_faults_of_boot(state: dict | None, boot_id: str) -> list:
    """A failed active check stands until the node reboots (remediation), like a kernel-log fault."""
    if not state or state.get("boot_id") != boot_id:
        return []
    return [classify.Fault(f["condition"], f["reason"], f["message"], f["severity"]) for f in state["faults"]]


# --- the node (impure) ------------------------------------------------------


def read_text(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def read_json(path: str) -> dict | None:
    text = read_text(path)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def kernel_log(path: str = "/dev/kmsg") -> list[str]:
    """Every record still in the kernel's ring buffer (non-blocking read from the start)."""
    if os.path.isfile(path):  # a saved log rather than the device: whole lines
        return (read_text(path) or "").splitlines()
    lines = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return lines
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except OSError as err:
                if err.errno == errno.EPIPE:  # overwritten while reading: go on
                    continue
                break
            if not record:
                break
            lines.append(record.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return lines


def run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout if proc.returncode == 0 else None


def run_on_host(config: dict, argv: list[str], timeout: int) -> tuple[int, str] | None:
    """(exit status, stdout) of a host program (nsenter into the host's namespaces: DCGM and
    nccl-tests live on the host); None when it is not installed there."""
    prefix = list(config.get("host_command", []))
    try:
        proc = subprocess.run(prefix + argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, ""
    except FileNotFoundError:
        return None
    if proc.returncode == 127 or (prefix and "No such file or directory" in proc.stderr and not proc.stdout):
        return None
    return proc.returncode, proc.stdout


def rdma_links_from_sysfs(root: str = "/sys/class/infiniband") -> list[dict] | None:
    """`rdma -j link`'s answer, from sysfs (the image has no iproute2)."""
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return None
    links = []
    for dev in devices:
        netdevs = sorted(os.listdir(f"{root}/{dev}/device/net")) if os.path.isdir(f"{root}/{dev}/device/net") else []
        for port in sorted(os.listdir(f"{root}/{dev}/ports")):
            state = (read_text(f"{root}/{dev}/ports/{port}/state") or "").split(":")[-1].strip()
            phys = (read_text(f"{root}/{dev}/ports/{port}/phys_state") or "").split(":")[-1].strip()
            links.append({"ifname": dev, "port": int(port), "state": state, "physical_state": phys,
                          "netdev": netdevs[0] if netdevs else None})
    return links


def observe_faults(config: dict, pool: dict, state: dict | None, boot_id: str) -> tuple[dict, list]:
    log = kernel_log(config.get("kernel_log", "/dev/kmsg"))
    fresh = classify.xid_faults(classify.xid_events(log), set(config["fatal_xids"]), set(config["degraded_xids"]))
    fresh += classify.pcie_faults(log)
    state, faults = sticky_faults(state, boot_id, fresh)
    query = ["nvidia-smi", "--format=csv,noheader,nounits"]
    identity = run(query + ["--query-gpu=index,name"])
    faults += classify.gpu_count_faults(identity, pool["gpu_count"])
    if identity is not None:
        faults += classify.memory_faults(run(query + ["--query-gpu=" + ",".join(classify.MEMORY_FIELDS)]) or "")
        if pool.get("nvlink"):
            faults += classify.nvlink_faults(run(["nvidia-smi", "nvlink", "-s"]))
    if pool.get("roce_interfaces"):
        faults += classify.roce_faults(rdma_links_from_sysfs(config.get("infiniband_sysfs", "/sys/class/infiniband")),
                                       pool["roce_interfaces"])
    faults.sort(key=lambda f: f.severity != classify.FATAL)
    return state, faults


class Api:
    """The API server, as this pod's service account."""

    def __init__(self) -> None:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        self.base = f"https://{host}:{port}"
        self.context = ssl.create_default_context(cafile=f"{SA_DIR}/ca.crt")

    def call(self, method: str, path: str, body=None, content_type: str = "application/json") -> dict:
        with open(f"{SA_DIR}/token") as fh:  # re-read: projected tokens rotate
            token = fh.read().strip()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json"})
        with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
            return json.loads(response.read() or b"{}")


def patch_taints(api: Api, node: dict, taints: list) -> None:
    # JSON patch with a resourceVersion test: no lost update against the
    # node lifecycle controller or an admin's `kubectl taint`.
    api.call("PATCH", f"/api/v1/nodes/{node['metadata']['name']}", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/spec/taints", "value": taints},
    ], "application/json-patch+json")


def apply(api: Api, node: dict, update: dict, stamp: str) -> None:
    name = node["metadata"]["name"]
    if update["taints"] is not None:
        patch_taints(api, node, update["taints"])
    api.call("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": update["conditions"]}},
             "application/strategic-merge-patch+json")
    post_events(api, name, update["events"], stamp)


def post_events(api: Api, name: str, events: list, stamp: str) -> None:
    for kind, reason, message in events:
        api.call("POST", "/api/v1/namespaces/default/events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{name}.corral-gpu-health.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": name},
            "type": kind, "reason": reason, "message": message[:1024], "source": {"component": "corral-gpu-health",
                                                                                 "host": name},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        })


def once(api: Api, config: dict, node_name: str) -> None:
    node = api.call("GET", f"/api/v1/nodes/{node_name}")
    pool_name = node["metadata"].get("labels", {}).get(POOL_LABEL)
    pool = config["pools"].get(pool_name)
    if pool is None:
        return  # not a GPU pool corral knows: nothing to check
    boot_id = (read_text("/proc/sys/kernel/random/boot_id") or "").strip()
    verdict_path = config["verdict_path"]
    verdict = current_verdict(read_json(verdict_path), boot_id)
    if verdict is None and pool.get("run_preflight") and pool.get("preflight_script"):
        # Cloud nodes: no Ansible run, so the agent runs the pool's preflight.
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     pool["preflight_script"]), "--verdict", verdict_path],
                       capture_output=True, timeout=900, check=False)
        verdict = current_verdict(read_json(verdict_path), boot_id)
    state_path = os.path.join(os.path.dirname(verdict_path), "faults.json")
    state, faults = observe_faults(config, pool, read_json(state_path), boot_id)
    write_json(state_path, state)
    active_path = os.path.join(os.path.dirname(verdict_path), "active.json")
    active = read_json(active_path)
    faults += active_faults_of_boot(active, boot_id)
    faults.sort(key=lambda f: f.severity != classify.FATAL)
    stamp = now()
    update = plan(node, verdict, faults, config["evict_on_fatal"], stamp)
    apply(api, node, update, stamp)
    if not faults and verdict is not None and verdict.get("passed"):
        active_check(api, config, pool, node_name, active, active_path, boot_id)


def node_pods(api: Api, node_name: str) -> list:
    return api.call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node_name}").get("items", [])


def active_check(api: Api, config: dict, pool: dict, node_name: str, state: dict | None, state_path: str,
                 boot_id: str) -> None:
    """The GPU burn and NCCL all-reduce on an idle node, fenced by the preflight taint while they run."""
    settings = config.get("active") or {}
    node = api.call("GET", f"/api/v1/nodes/{node_name}")
    due, _ = active_check_due(node, node_pods(api, node_name), state, time.time(), settings)
    if not due:
        return
    # No GPU pod may land while the GPUs burn: the preflight taint (one of
    # the two the agent may set) fences the node for the test's minutes.
    taints = list(node.get("spec", {}).get("taints") or [])
    fence = {"key": PREFLIGHT_TAINT, "value": "active-check", "effect": "NoSchedule", "timeAdded": now()}
    patch_taints(api, node, taints + [fence])
    try:
        if classify.gpu_pods(node_pods(api, node_name)):
            return  # a GPU pod was bound between the look and the fence: leave it be
        diag = run_on_host(config, ["dcgmi", "diag", "-r", str(settings["dcgm_level"]), "-j"], timeout=1800)
        nccl = run_on_host(config, pool["nccl_command"], timeout=900) if pool.get("nccl_command") else None
        faults = classify.active_faults(diag, nccl, pool.get("nccl_min_bus_gbps"))
        write_json(state_path, active_state(state, boot_id, time.time(), faults))
        ran = [name for name, result in (("dcgmi diag", diag), ("all_reduce_perf", nccl)) if result is not None]
        if faults:
            event = ("Warning", "GPUActiveCheckFailed", faults[0].message)
        elif ran:
            event = ("Normal", "GPUActiveCheckPassed", f"{' and '.join(ran)} passed on an idle node")
        else:
            event = ("Normal", "GPUActiveCheckSkipped", "neither dcgmi nor all_reduce_perf is installed on the host")
        post_events(api, node_name, [event], now())
    finally:
        # Lift the fence; a failure is tainted corral.dev/unhealthy by the next round.
        node = api.call("GET", f"/api/v1/nodes/{node_name}")
        left = [t for t in node.get("spec", {}).get("taints") or []
                if not (t.get("key") == PREFLIGHT_TAINT and t.get("value") == "active-check")]
        if len(left) != len(node.get("spec", {}).get("taints") or []):
            patch_taints(api, node, left)


def main(argv: list[str]) -> int:
    config = json.load(open(os.environ.get("CORRAL_HEALTH_CONFIG",
                                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json"))))
    api, node_name = Api(), os.environ["NODE_NAME"]
    while True:
        try:
            once(api, config, node_name)
            if argv[1:] == ["--once"]:  # one round (debugging, tests)
                return 0
        except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
            # 409/422 from a resourceVersion race, an API server away: try again next round.
            print(f"corral-gpu-health: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            if argv[1:] == ["--once"]:
                return 1
        time.sleep(config["interval_seconds"])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
