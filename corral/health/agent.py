"""corral's GPU health agent: one pod per GPU node (DaemonSet `corral-gpu-health`).

Standard library only; it runs as it is from a ConfigMap in a stock Python
image, beside classify.py, with the node's kernel log, sysfs and the
preflight verdict's folder mounted from the host (docs/gpu-health.md).
A thread follows the kernel log (/dev/kmsg) as it is written and hands each
Xid or uncorrected PCIe error to the loop at once; every `interval_seconds`
(5) it runs its local checks (no API call):

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

It knows its Node (and, with active checks on, the pods bound to it) from a
watch, never by asking again (docs/scale.md: at 7,500 nodes a GET every 30 s
is 250 requests a second): one list, then a watch with bookmarks resumed
from the last resourceVersion, a relist only on 410 Gone or at a jittered
resync (one relist per node per hour). Whenever its checks or the Node
change it compares what the Node should say with what it says, and writes
only the difference: the fault conditions (heartbeat times ignored) and the
corral.dev/unhealthy taint (NoExecute for fatal faults when the cluster file
says so, NoSchedule otherwise). Events are aggregated and rate-limited per
node as client-go's EventCorrelator does.

It also carries out the repair controller's `reset` and `reboot` of its node
(corral.dev/repair -> corral.dev/repair-status, once per request id) and burns
a node in before it is admitted, at join and after a repair (dcgmi diag and a
one-node all_reduce_perf against the GPU model's baseline -> corral.dev/burn-in;
docs/gpu-health.md, "Burn-in before readmission" and "Automatic repair: the
node agent's side").

It talks to the API server with its service account over HTTPS, patching
only its own node: a ValidatingAdmissionPolicy holds it to that node and to
corral.dev/ taints (the kubelet's own credential may not remove taints).
"""

from __future__ import annotations

import errno
import json
import os
import queue
import random
import shutil
import ssl
import stat
import subprocess
import sys
import threading
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
# The repair protocol with the repair controller (corral/health/repair_protocol.py; copied: this
# file runs alone beside classify.py, and tests check the two agree).
REPAIR_ANNOTATION = "corral.dev/repair"
REPAIR_STATUS_ANNOTATION = "corral.dev/repair-status"
BURN_IN_ANNOTATION = "corral.dev/burn-in"
BURN_IN_TAINT = "corral.dev/burn-in"
RESET, REBOOT = "reset", "reboot"
JOIN_BURN_IN_ID = "join"
ACTIVE_CHECK_FENCE = "active-check"        # the preflight taint's value while an active check runs
# A reboot asked for and not seen (the boot id unchanged) after this long has failed.
REBOOT_GRACE_SECONDS = 900


# --- the decisions (pure) -------------------------------------------------


def now(epoch: float | None = None) -> str:
    moment = datetime.now(timezone.utc) if epoch is None else datetime.fromtimestamp(epoch, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def current_verdict(verdict: dict | None, boot_id: str | None) -> dict | None:
    """The verdict if it belongs to this boot (a reboot must pass again), else None."""
    if not verdict or not boot_id or verdict.get("boot_id") != boot_id:
        return None
    return verdict


KEEP = "keep"      # plan(): leave the burn-in taint as it is


def plan(node: dict, verdict: dict | None, faults: list, evict_on_fatal: bool, stamp: str,
         hold_preflight: bool = False, burn_in_value: str | None = KEEP) -> dict:
    """What to write to the node: {"conditions": [...], "taints": [...] or None, "events": [...]}.

    `taints` is None when they stay as they are. Conditions keep their last
    transition time unless their status changes. `hold_preflight`: a passing
    verdict does not lift the preflight taint (the node's burn-in has not
    passed: admission waits for it, and the burn-in lifts the taint).
    `burn_in_value`: the corral.dev/burn-in taint's value the node's burn-in
    result calls for (burn_in_taint_value; None: no such taint), or KEEP.
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
        if not hold_preflight:
            new = [t for t in new if t.get("key") != PREFLIGHT_TAINT]
    elif verdict is not None and not any(t.get("key") == PREFLIGHT_TAINT for t in new):
        # This boot's preflight failed on a node without the taint (rebooted
        # by hand, or lifted before a remediation's reboot): behind it again.
        new.append({"key": PREFLIGHT_TAINT, "value": "failed", "effect": "NoSchedule"})
    if burn_in_value != KEEP:
        new = [t for t in new if t.get("key") != BURN_IN_TAINT]
        if burn_in_value:
            new.append({"key": BURN_IN_TAINT, "value": burn_in_value, "effect": "NoSchedule"})
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


def sticky_faults(state: dict | None, boot_id: str, fresh: list, where: dict | None = None) -> tuple[dict, list]:
    """Kernel-log faults of this boot, old and new (the ring buffer forgets; the node does not heal).

    `where`: fault reason -> the PCI addresses it was reported on (kept, so a GPU reset knows which
    GPU to reset). The state also keeps this boot's GPU resets (`resets`: see after_reset)."""
    same_boot = bool(state) and state.get("boot_id") == boot_id
    # Copies: the caller compares the new state with the old one to decide whether to write it.
    kept = [dict(f) for f in state.get("faults", [])] if same_boot else []
    by_key = {(f["condition"], f["reason"]): f for f in kept}
    for fault in fresh:
        entry = by_key.get((fault.condition, fault.reason))
        if entry is None:
            entry = {"condition": fault.condition, "reason": fault.reason, "message": fault.message,
                     "severity": fault.severity}
            kept.append(entry)
            by_key[(fault.condition, fault.reason)] = entry
        pcis = (where or {}).get(fault.reason)
        if pcis:
            entry["pcis"] = sorted(set(entry.get("pcis", [])) | set(pcis))
    faults = [classify.Fault(f["condition"], f["reason"], f["message"], f["severity"]) for f in kept]
    new_state = {"boot_id": boot_id, "faults": kept}
    if same_boot and state.get("resets"):
        new_state["resets"] = dict(state["resets"])
    return new_state, faults


def after_reset(state: dict | None, boot_id: str, reset_pcis: list[str], usec: int) -> dict:
    """The kernel-log fault state after a successful reset of the GPUs at `reset_pcis`: a new epoch
    for each of them. Their Xid faults are dropped, and their kernel-log lines from before `usec`
    (the kernel log's time since boot at the reset) are not read as faults again; other GPUs' and
    other kinds of faults stand."""
    keys = {classify.pci_key(p) for p in reset_pcis}
    same_boot = bool(state) and state.get("boot_id") == boot_id
    resets = dict(state.get("resets", {})) if same_boot else {}
    resets.update({key: usec for key in keys})
    kept = [dict(f) for f in (state.get("faults", []) if same_boot else [])
            if not (f["reason"].startswith("Xid") and f.get("pcis")
                    and {classify.pci_key(p) for p in f["pcis"]} <= keys)]
    return {"boot_id": boot_id, "faults": kept, "resets": resets}


# Hold-down of device faults (a RoCE port, an NVLink, nvidia-smi's ECC and GPU count: states read every
# round, so a link that goes down 20 s of every minute would be tainted and lifted at every flap, and the
# repair controller, which waits for a taint to stand settle_seconds (30), would never repair it).
# - HOLD_DOWN_SECONDS: once such a fault cleared, the taint stays this long before it is lifted. The
#   kubelet does the same for its pressure conditions against "oscillation of node conditions":
#   --eviction-pressure-transition-period, "the duration for which the kubelet has to wait before
#   transitioning out of an eviction pressure condition", default 5m (kubernetes/website
#   docs/tasks/administer-cluster/out-of-resource.md; kubelet eviction Config.PressureTransitionPeriod,
#   kubernetes/kubernetes PR 25772). Five minutes is also far above the controller's 30 s settle time,
#   so a fault that comes back within it is one steady taint the controller repairs. So is a one-off
#   device fault that cleared by itself (a link down once): on a GPU node that is suspect hardware,
#   and a repair is followed by a burn-in, where a fabric-wide blip trips the circuit breaker instead.
# - FLAP_ONSETS in FLAP_WINDOW_SECONDS: a fault that came back this often is flapping, and keeps the
#   node tainted (message "flapping: N faults in M minutes") until a repair, however long it stays away
#   between flaps: three onsets in half an hour is at least two returns after clearing, one more than a
#   one-off glitch, and the window is six hold-downs, so a fault that returns just after each lift is
#   caught on its third onset instead of going back into service each time.
# A repair starts a new epoch (a new boot, or a repair the agent carried out and reported done): the
# hold-down never delays the lift after a repair's passed burn-in.
HOLD_DOWN_SECONDS = 300
FLAP_ONSETS = 3
FLAP_WINDOW_SECONDS = 1800


def repair_epoch(boot_id: str, repair_record: dict | None) -> str:
    """The span of time between repairs: this boot, and the last repair the agent carried out in it."""
    done = repair_record.get("id") if repair_record and repair_record.get("state") == "done" else None
    return f"{boot_id}/{done or ''}"


def hold_down(state: dict | None, epoch: str, now_epoch: float, current: list,
              hold_seconds: float = HOLD_DOWN_SECONDS) -> tuple[dict, list]:
    """(the hold-down state to keep, the device faults to act on): `current` (what the node says now)
    and those that cleared less than HOLD_DOWN_SECONDS ago or came back FLAP_ONSETS times within
    FLAP_WINDOW_SECONDS this epoch. The state, per condition and reason: its onsets (times it appeared)
    and when it cleared (None while present). Messages carry times, never ages: the same fault is the
    same condition every round (no status write per round)."""
    same_epoch = bool(state) and state.get("epoch") == epoch
    old = {k: dict(v) for k, v in (state.get("faults", {}) if same_epoch else {}).items()}
    now_keys = set()
    faults = []
    for fault in current:
        key = f"{fault.condition}/{fault.reason}"
        now_keys.add(key)
        entry = old.get(key) or {"onsets": [], "cleared": now_epoch}
        if entry.get("cleared") is not None:
            entry["onsets"] = entry["onsets"] + [now_epoch]          # it (re)appeared now
        entry.update(condition=fault.condition, reason=fault.reason, message=fault.message,
                     severity=fault.severity, cleared=None)
        old[key] = entry
    kept = {}
    for key, entry in sorted(old.items()):
        if key not in now_keys and entry.get("cleared") is None:
            entry["cleared"] = now_epoch
        recent = [t for t in entry["onsets"] if now_epoch - t <= FLAP_WINDOW_SECONDS]
        if len(recent) >= FLAP_ONSETS:
            entry["flapping"] = len(recent)     # latched until a repair (a new epoch)
        if entry.get("flapping"):
            message = (f"flapping: {entry['flapping']} faults in {FLAP_WINDOW_SECONDS // 60} minutes, held until "
                       f"a repair; last: {entry['message']}")
        elif entry["cleared"] is None:
            message = entry["message"]
        elif now_epoch - entry["cleared"] < hold_seconds:
            message = (f"{entry['message']} (cleared at {now(entry['cleared'])}; held down until "
                       f"{now(entry['cleared'] + hold_seconds)} to see it stays away)")
        else:
            message = None
        if message is not None:
            faults.append(classify.Fault(entry["condition"], entry["reason"], message[:1000], entry["severity"]))
        if message is not None or recent:
            kept[key] = dict(entry, onsets=recent)       # remembered while it may still count as a flap
    return {"epoch": epoch, "faults": kept}, faults


def xid_codes(state: dict | None) -> list[int]:
    """The Xids of the kernel-log fault state."""
    return sorted(int(f["reason"][3:]) for f in (state or {}).get("faults", [])
                  if f["reason"].startswith("Xid") and f["reason"][3:].isdigit())


def faulted_gpus(state: dict | None) -> list[str]:
    """The PCI addresses the kernel log named in this boot's Xid faults."""
    return sorted({p for f in (state or {}).get("faults", []) if f["reason"].startswith("Xid")
                   for p in f.get("pcis", [])})


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
    if keys & {UNHEALTHY_TAINT, PREFLIGHT_TAINT, BURN_IN_TAINT}:
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


def json_annotation(node: dict | None, key: str) -> dict | None:
    """A JSON-valued annotation of the node, or None (absent, or not a JSON object)."""
    text = ((node or {}).get("metadata", {}).get("annotations") or {}).get(key)
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def repair_step(request: dict | None, record: dict | None, boot_id: str, now_epoch: float) -> str:
    """What the agent does about the controller's repair request, given its own record of it
    (repair.json, beside the preflight verdict on the host: it outlives the agent and a reboot):

    - "none": no request the agent carries out (none, another action, or no id);
    - "report": the request was carried out already (its id is in the record as done or
      failed): not again, only make sure the node says so;
    - "reset" / "reboot": carry it out now;
    - "rebooted": the reboot asked for happened (the boot id changed): done;
    - "wait": the reboot was asked for in this boot and has not happened yet (an agent restarted
      while the host shuts down must not ask again);
    - "reboot-timed-out": asked for REBOOT_GRACE_SECONDS ago in this same boot: failed.
    """
    if not request or request.get("action") not in (RESET, REBOOT) or not request.get("id"):
        return "none"
    mine = record if record and record.get("id") == request["id"] else None
    if mine is None:
        return request["action"]
    if mine.get("state") in ("done", "failed"):
        return "report"
    if mine.get("action") == REBOOT:
        if mine.get("boot_id") != boot_id:
            return "rebooted"
        if now_epoch - float(mine.get("started", now_epoch)) > REBOOT_GRACE_SECONDS:
            return "reboot-timed-out"
        return "wait"
    return request["action"]      # a reset interrupted by an agent restart: a reset may be done again


FINISHED = ("passed", "failed")


def burn_in_due(node: dict, record: dict | None, burn_record: dict | None = None) -> str | None:
    """The id of the burn-in the node needs now, or None.

    After a repair the agent carried out (its record says done for the controller's current
    request): that repair's id, until the node carries a finished burn-in of it. A new node
    (behind the preflight taint, with no burn-in yet, or one an agent restart interrupted):
    JOIN_BURN_IN_ID. A finished burn-in is not repeated: a failed one stays failed until a new
    repair. `burn_record`: the agent's own record of its last burn-in (burn-in.json beside the
    verdict), which a lost or stale annotation write does not undo."""
    burn = json_annotation(node, BURN_IN_ANNOTATION)

    def finished(burn_id: str) -> bool:
        return any(r and r.get("id") == burn_id and r.get("result") in FINISHED for r in (burn, burn_record))

    request = json_annotation(node, REPAIR_ANNOTATION)
    if request and record and record.get("id") == request.get("id") and record.get("state") == "done":
        return None if finished(request["id"]) else request["id"]
    behind_preflight = any(t.get("key") == PREFLIGHT_TAINT and t.get("value") != ACTIVE_CHECK_FENCE
                           for t in node.get("spec", {}).get("taints") or [])
    unstarted = burn is None or (burn.get("id") == JOIN_BURN_IN_ID and burn.get("result") == "running")
    if behind_preflight and unstarted and not finished(JOIN_BURN_IN_ID):
        return JOIN_BURN_IN_ID
    return None


def holds_preflight(node: dict, burn_in: dict) -> bool:
    """Whether admission still waits for a burn-in: with burn-in on, the preflight taint stays
    until the node's last burn-in passed (a pass of the preflight alone does not admit it)."""
    burn = json_annotation(node, BURN_IN_ANNOTATION)
    return bool(burn_in.get("enabled")) and not (burn and burn.get("result") == "passed")


def burn_in_taint_value(node: dict, burn_in: dict) -> str | None:
    """The corral.dev/burn-in taint's value the node's burn-in result calls for, every round (a
    taint write lost after a burn-in is made good by the next round): pending while one runs,
    failed after a failure, none after a pass or before any; KEEP with burn-in off."""
    if not burn_in.get("enabled"):
        return KEEP
    result = (json_annotation(node, BURN_IN_ANNOTATION) or {}).get("result")
    return {"running": "pending", "failed": "failed"}.get(result)


def burn_in_taints(taints: list, result: str, join: bool) -> list:
    """The node's taints for a burn-in that is running, passed or failed: pending and failed keep
    corral.dev/burn-in on the node; a pass lifts it and corral.dev/unhealthy (the fault is repaired
    and proven so), and at join the preflight taint too (the burn-in was the last step of admission)."""
    kept = [t for t in taints if t.get("key") != BURN_IN_TAINT]
    if result == "passed":
        lifted = {UNHEALTHY_TAINT} | ({PREFLIGHT_TAINT} if join else set())
        return [t for t in kept if t.get("key") not in lifted]
    return kept + [{"key": BURN_IN_TAINT, "value": "pending" if result == "running" else "failed",
                    "effect": "NoSchedule"}]


def compute_apps_on(apps_csv: str, pci_keys: set[str]) -> list[str]:
    """`nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader,nounits` -> the pids
    holding one of these GPUs (pci_key form)."""
    pids = []
    for line in apps_csv.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and classify.pci_key(fields[1]) in pci_keys:
            pids.append(fields[0])
    return pids


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


def kernel_log_faults(config: dict, lines: list[str], state: dict | None, boot_id: str) -> tuple[dict, list]:
    """This boot's kernel-log faults: those in the state file and those in `lines`."""
    lines = classify.kernel_lines(lines)
    resets = state.get("resets", {}) if state and state.get("boot_id") == boot_id else {}
    events = classify.since_reset(classify.xid_events(lines), resets)
    fresh = classify.xid_faults(events, set(config["fatal_xids"]), set(config["degraded_xids"]))
    fresh += classify.pcie_faults(lines)
    where = {f"Xid{code}": sorted({e.pci for e in events if e.code == code}) for code in {e.code for e in events}}
    return sticky_faults(state, boot_id, fresh, where)


def device_faults(config: dict, pool: dict) -> list:
    """What nvidia-smi and the RoCE ports say now (asked every round: these are states, not log lines)."""
    query = ["nvidia-smi", "--format=csv,noheader,nounits"]
    identity = run(query + ["--query-gpu=index,name"])
    faults = classify.gpu_count_faults(identity, pool["gpu_count"])
    if identity is not None:
        faults += classify.memory_faults(run(query + ["--query-gpu=" + ",".join(classify.MEMORY_FIELDS)]) or "")
        if pool.get("nvlink"):
            faults += classify.nvlink_faults(run(["nvidia-smi", "nvlink", "-s"]))
    if pool.get("roce_interfaces"):
        faults += classify.roce_faults(rdma_links_from_sysfs(config.get("infiniband_sysfs", "/sys/class/infiniband")),
                                       pool["roce_interfaces"])
    return faults


def followable(path: str) -> bool:
    """Whether `path` is a kernel log to follow as it is written (the device, or a FIFO
    standing in for it) rather than a saved log re-read every round."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


class KernelLogFollower:
    """The kernel log as it is written: a thread blocked on /dev/kmsg hands every
    line that may be a fault (classify.fault_line) to the agent at once, so a
    fatal Xid is tainted within the second instead of at the next round.

    /dev/kmsg (the kernel's Documentation/ABI/testing/dev-kmsg): every read()
    returns one record, "prio,seq,usec,flags;message\\n" (lines starting with a
    space add key/value context); the first read() after open() returns the
    first record still in the buffer, so the backlog comes once and then read()
    blocks until the next record. When records are overwritten before this
    reader got them, read() fails with EPIPE and the kernel moves the position
    to the next record still there: the reader goes on (the lost ones are gone;
    their faults, if any, were in the state file or are lost with the buffer).
    A FIFO reads the same way, except that a record may arrive in pieces: lines
    are split at newlines, and a writer closing it is an end, reopened.

    It runs in a thread of its own, not the clock's: it waits in the kernel,
    not on anything the simulated clock could move.
    """

    REOPEN_SECONDS = 1.0

    def __init__(self, path: str, deliver, stopped) -> None:
        self.path, self.deliver, self.stopped = path, deliver, stopped
        self.overruns = 0

    def start(self) -> None:
        threading.Thread(target=self.run, name="kernel-log", daemon=True).start()

    def _read_until_end(self, fd: int, read=os.read) -> None:
        partial = b""
        while not self.stopped():
            try:
                chunk = read(fd, 8192)
            except OSError as err:
                if err.errno != errno.EPIPE:
                    raise
                self.overruns += 1       # the kernel already moved us on to the oldest record left
                continue
            if not chunk:
                return
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            faults = [line for line in (raw.decode("utf-8", "replace") for raw in lines) if classify.fault_line(line)]
            if faults:
                self.deliver(faults)

    def run(self) -> None:
        while not self.stopped():
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except OSError as err:
                print(f"corral-gpu-health: kernel log {self.path}: {err}", file=sys.stderr, flush=True)
                time.sleep(self.REOPEN_SECONDS)
                continue
            try:
                self._read_until_end(fd)
            except OSError as err:
                print(f"corral-gpu-health: kernel log {self.path}: {err}", file=sys.stderr, flush=True)
            finally:
                os.close(fd)
            if not self.stopped():
                time.sleep(self.REOPEN_SECONDS)


# --- time (the benchmark and the load test pass a simulated clock) -------------


class SystemClock:
    """Real time and real threads: what the agent runs on in its pod.

    The seam exists so that benchmarks/bench_api_load.py and
    tests/health/test_agent_load.py run this same code through simulated
    hours (tests/health/simclock.py); nothing here changes with it.
    """

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)
    time = staticmethod(time.time)    # last: the name shadows the module in this class body

    @staticmethod
    def queue() -> queue.Queue:
        return queue.Queue()

    @staticmethod
    def spawn(target) -> None:
        threading.Thread(target=target, daemon=True).start()

    @staticmethod
    def blocking(read):
        """A read that waits on the API server (a watch stream's next line)."""
        return read()


# --- the API server ---------------------------------------------------------------


class Api:
    """The API server, as this pod's service account."""

    def __init__(self, base: str | None = None, sa_dir: str = SA_DIR, user_agent: str = "corral-gpu-health") -> None:
        if base is None:
            base = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
        self.base, self.sa_dir, self.user_agent = base, sa_dir, user_agent
        self.context = ssl.create_default_context(cafile=f"{sa_dir}/ca.crt")

    def open(self, method: str, path: str, body=None, content_type: str = "application/json", timeout: float = 30):
        with open(f"{self.sa_dir}/token") as fh:  # re-read: projected tokens rotate
            token = fh.read().strip()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json",
            # The API server's audit log and priority-and-fairness see who asks.
            "User-Agent": self.user_agent})
        return urllib.request.urlopen(request, context=self.context, timeout=timeout)

    def call(self, method: str, path: str, body=None, content_type: str = "application/json") -> dict:
        with self.open(method, path, body, content_type) as response:
            return json.loads(response.read() or b"{}")

    def stream(self, path: str, timeout: float):
        """A watch: the response, read line by line (one JSON watch event a line)."""
        return self.open("GET", path, timeout=timeout)


def patch_taints(api: Api, node: dict, taints: list) -> dict:
    """The node after the patch. JSON patch with a resourceVersion test: no lost
    update against the node lifecycle controller or an admin's `kubectl taint`."""
    return api.call("PATCH", f"/api/v1/nodes/{node['metadata']['name']}", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/spec/taints", "value": taints},
    ], "application/json-patch+json")


def conditions_differ(node: dict, conditions: list) -> bool:
    """Whether writing `conditions` would change the node, heartbeat times aside
    (a heartbeat alone is a write to etcd on every node every round)."""
    old = {c.get("type"): c for c in node.get("status", {}).get("conditions") or []}
    fields = ("status", "reason", "message", "lastTransitionTime")
    return any(tuple(old.get(c["type"], {}).get(f) for f in fields) != tuple(c.get(f) for f in fields)
               for c in conditions)


# Kubernetes' own event correlator (client-go tools/record/events_cache.go):
# the same event within 10 minutes is one Event whose count goes up; a
# source may send 25 events about an object at once, then one per 5 minutes.
EVENT_AGGREGATE_SECONDS = 600
EVENT_BURST = 25
EVENT_REFILL_SECONDS = 300


class EventRecorder:
    """This node's events: repeats become count++ on the Event already written
    (PATCH), and a token bucket per node caps a flapping fault's events."""

    def __init__(self, api: Api, node_name: str, clock) -> None:
        self.api, self.node_name, self.clock = api, node_name, clock
        self.tokens, self.refilled = float(EVENT_BURST), clock.monotonic()
        self.recent: dict[tuple[str, str, str], dict] = {}

    def _take_token(self) -> bool:
        now = self.clock.monotonic()
        self.tokens = min(EVENT_BURST, self.tokens + (now - self.refilled) / EVENT_REFILL_SECONDS)
        self.refilled = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def emit(self, events: list) -> None:
        for kind, reason, message in events:
            if not self._take_token():
                print(f"corral-gpu-health: event rate limit: dropped {reason}", file=sys.stderr, flush=True)
                continue
            key, moment, stamp = (kind, reason, message[:1024]), self.clock.monotonic(), now(self.clock.time())
            seen = self.recent.get(key)
            if seen and moment - seen["at"] < EVENT_AGGREGATE_SECONDS:
                seen["count"] += 1
                seen["at"] = moment
                self.api.call("PATCH", f"/api/v1/namespaces/default/events/{seen['name']}",
                              {"count": seen["count"], "lastTimestamp": stamp},
                              "application/strategic-merge-patch+json")
                continue
            written = self.api.call("POST", "/api/v1/namespaces/default/events", {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{self.node_name}.corral-gpu-health.", "namespace": "default"},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node_name},
                "type": kind, "reason": reason, "message": key[2],
                "source": {"component": "corral-gpu-health", "host": self.node_name},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            })
            name = (written.get("metadata") or {}).get("name")
            self.recent = {k: v for k, v in self.recent.items() if moment - v["at"] < EVENT_AGGREGATE_SECONDS}
            if name:
                self.recent[key] = {"name": name, "count": 1, "at": moment}


# client-go's reflector: watches end after 5 to 10 minutes (minWatchTimeout,
# tools/cache/reflector.go) so API servers' watchers spread out.
WATCH_TIMEOUT_SECONDS = (300, 600)
RETRY_SECONDS = (1, 30)


class Watch:
    """One kind of object of this node, listed once and then watched (an informer
    in miniature, in its own thread): the API server tells the agent what
    changes; the agent does not ask again.

    List with resourceVersion=0 (the API server's watch cache, not etcd),
    watch from the list's resourceVersion with bookmarks (the API server
    moves the resourceVersion on about once a minute, so a quiet node's
    watch resumes where it was instead of relisting), resume after each
    watch's timeout. Relist only on 410 Gone (consistent, from etcd: the
    cache may be behind what was seen) or at the resync, from the cache
    no older than what was seen (resourceVersionMatch=NotOlderThan).
    API semantics: kubernetes/website api-concepts.md ("Efficient detection
    of changes", "Watch bookmarks", "Semantics for get and list").
    """

    def __init__(self, agent: "Agent", kind: str, path: str, selector: str, resync_at: float,
                 resync_seconds: float) -> None:
        self.agent, self.kind, self.path, self.selector = agent, kind, path, selector
        self.resync_at, self.resync_seconds = resync_at, resync_seconds
        self.rv: str | None = None
        self.gone = False

    def _list(self) -> None:
        clock, query = self.agent.clock, f"fieldSelector={self.selector}"
        if self.gone:
            query += "&resourceVersion="            # 410: a consistent read
        elif self.rv is None:
            query += "&resourceVersion=0"           # first list: the watch cache
        else:
            query += f"&resourceVersion={self.rv}&resourceVersionMatch=NotOlderThan"
        answer = self.agent.api.call("GET", f"{self.path}?{query}")
        self.rv, self.gone = answer["metadata"]["resourceVersion"], False
        while self.resync_at <= clock.monotonic():
            self.resync_at += self.resync_seconds
        self.agent.inbox.put(("sync", self.kind, answer.get("items") or []))

    def _watch(self) -> None:
        clock = self.agent.clock
        timeout = min(self.agent.rng.uniform(*WATCH_TIMEOUT_SECONDS), self.resync_at - clock.monotonic())
        query = (f"fieldSelector={self.selector}&watch=1&allowWatchBookmarks=true&resourceVersion={self.rv}"
                 f"&timeoutSeconds={max(1, int(timeout))}")
        response = self.agent.api.stream(f"{self.path}?{query}", timeout=max(1, int(timeout)) + 60)
        with response:
            while True:   # read to the end, also after an ERROR: the server closes the stream
                line = clock.blocking(response.readline)
                if not line:
                    return
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    self.gone = obj.get("code") == 410
                    self.rv = None if self.gone else self.rv
                    continue
                self.rv = obj.get("metadata", {}).get("resourceVersion", self.rv)
                if event.get("type") != "BOOKMARK":
                    self.agent.inbox.put(("event", self.kind, event["type"], obj))

    def run(self) -> None:
        clock, failures = self.agent.clock, 0
        while not self.agent.stopped:
            try:
                if self.rv is None or clock.monotonic() >= self.resync_at:
                    self._list()
                self._watch()
                failures = 0
            except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
                failures += 1
                print(f"corral-gpu-health: {self.kind} watch: {type(err).__name__}: {err}", file=sys.stderr,
                      flush=True)
                if self.agent.stopped:
                    return
                # Backed off and jittered: a restarted API server is not met by every node at once.
                clock.sleep(self.agent.rng.uniform(RETRY_SECONDS[0], min(RETRY_SECONDS[1], 2 ** failures)))


STOP = ("stop",)


class Agent:
    """The agent's state: its Node and pods as the watches tell, its local checks' last result."""

    def __init__(self, api: Api, config: dict, node_name: str, clock=SystemClock, rng: random.Random | None = None):
        self.api, self.config, self.node_name, self.clock = api, config, node_name, clock
        self.rng = rng or random.Random()
        self.inbox = clock.queue()
        self.node: dict | None = None
        self.pods: dict[str, dict] = {}
        self.pods_synced = False
        self.local: tuple | None = None          # (pool, boot_id, verdict, faults, active state, its path)
        self.awaiting_rv: str | None = None       # our last write, until the watch shows it
        self.awaiting_since = 0.0
        self.events = EventRecorder(api, node_name, clock)
        self.stopped = False
        self.kernel_follower: KernelLogFollower | None = None
        self.kernel_lines: list[str] = []          # from the follower, not classified yet
        self.kernel_news = False
        self.kernel_faults: list = []
        self.device_faults: list = []
        self.active_faults: list = []

    # -- what the watches say --------------------------------------------------------

    def take(self, item: tuple) -> None:
        if item[0] == "kernel":
            self.kernel_lines.extend(item[1])
            self.kernel_news = True
            return
        if item[0] == "sync":
            _, kind, items = item
            if kind == "node":
                self.node = items[0] if items else None
                self.awaiting_rv = None
            else:
                self.pods = {self._pod_key(p): p for p in items}
                self.pods_synced = True
            return
        _, kind, event_type, obj = item
        if kind == "node":
            self.node = None if event_type == "DELETED" else obj
            if self.awaiting_rv and obj.get("metadata", {}).get("resourceVersion") == self.awaiting_rv:
                self.awaiting_rv = None
        elif event_type == "DELETED":
            self.pods.pop(self._pod_key(obj), None)
        else:
            self.pods[self._pod_key(obj)] = obj

    @staticmethod
    def _pod_key(pod: dict) -> str:
        return f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"

    def _wrote(self, node: dict) -> None:
        """The API server's answer to our write is the node as it now is; its
        watch event follows, and until it does older events must not make
        the agent write again."""
        if node.get("metadata"):
            self.node = node
            self.awaiting_rv, self.awaiting_since = node["metadata"].get("resourceVersion"), self.clock.monotonic()

    # -- local checks (no API call) ----------------------------------------------------

    def _new_kernel_lines(self) -> list[str]:
        if self.kernel_follower is not None:
            lines, self.kernel_lines, self.kernel_news = self.kernel_lines, [], False
            return lines
        return kernel_log(self.config.get("kernel_log", "/dev/kmsg"))

    def _record_kernel_faults(self, boot_id: str, lines: list[str]) -> list:
        state_path = os.path.join(os.path.dirname(self.config["verdict_path"]), "faults.json")
        old_state = read_json(state_path)
        state, faults = kernel_log_faults(self.config, lines, old_state, boot_id)
        if state != old_state:
            write_json(state_path, state)
        return faults

    def _held_device_faults(self, boot_id: str, current: list) -> list:
        """The device faults after the hold-down (hold_down; its state in flaps.json on the host)."""
        path = self._state_path("flaps.json")
        old_state = read_json(path)
        epoch = repair_epoch(boot_id, read_json(self._state_path("repair.json")))
        # hold_down_seconds: not in the add-on's config (the default holds); a test lab may shorten it.
        hold = self.config.get("hold_down_seconds", HOLD_DOWN_SECONDS)
        state, faults = hold_down(old_state, epoch, self.clock.time(), current, hold)
        if state != old_state:
            write_json(path, state)
        return faults

    def _all_faults(self) -> list:
        return sorted(self.kernel_faults + self.device_faults + self.active_faults,
                      key=lambda f: f.severity != classify.FATAL)

    def observe(self) -> None:
        config = self.config
        lines = self._new_kernel_lines()
        pool = config["pools"].get((self.node["metadata"].get("labels") or {}).get(POOL_LABEL))
        if pool is None:
            self.local = None
            return  # not a GPU pool corral knows: nothing to check
        boot_id = (read_text(config.get("boot_id_path", "/proc/sys/kernel/random/boot_id")) or "").strip()
        verdict_path = config["verdict_path"]
        verdict = current_verdict(read_json(verdict_path), boot_id)
        if verdict is None and pool.get("run_preflight") and pool.get("preflight_script"):
            # Cloud nodes: no Ansible run, so the agent runs the pool's preflight.
            subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         pool["preflight_script"]), "--verdict", verdict_path],
                           capture_output=True, timeout=900, check=False)
            verdict = current_verdict(read_json(verdict_path), boot_id)
        self.kernel_faults = self._record_kernel_faults(boot_id, lines)
        self.device_faults = self._held_device_faults(boot_id, device_faults(config, pool))
        active_path = os.path.join(os.path.dirname(verdict_path), "active.json")
        active = read_json(active_path)
        self.active_faults = active_faults_of_boot(active, boot_id)
        self.local = (pool, boot_id, verdict, self._all_faults(), active, active_path)

    def observe_kernel(self) -> None:
        """Kernel-log lines the follower brought between rounds, classified now: the
        round's other checks keep their last result."""
        lines = self._new_kernel_lines()
        if self.local is None:
            return            # before the first round, or not a GPU pool: the round decides
        pool, boot_id, verdict, _, active, active_path = self.local
        self.kernel_faults = self._record_kernel_faults(boot_id, lines)
        self.local = (pool, boot_id, verdict, self._all_faults(), active, active_path)

    # -- writes, only of a difference -------------------------------------------------------

    def reconcile(self) -> None:
        if self.node is None or self.local is None:
            return
        if self.awaiting_rv and self.clock.monotonic() - self.awaiting_since < 2 * self.config["interval_seconds"]:
            return
        self.awaiting_rv = None
        self._reconcile_now()

    def _reconcile_now(self) -> None:
        """One comparison and its writes, from the node as the agent last saw or wrote it."""
        pool, boot_id, verdict, faults, active, active_path = self.local
        stamp = now(self.clock.time())
        burn_in = self.config.get("burn_in") or {}
        update = plan(self.node, verdict, faults, self.config["evict_on_fatal"], stamp,
                      hold_preflight=holds_preflight(self.node, burn_in),
                      burn_in_value=burn_in_taint_value(self.node, burn_in))
        if update["taints"] is not None:
            self._wrote(patch_taints(self.api, self.node, update["taints"]))
        if conditions_differ(self.node, update["conditions"]):
            self._wrote(self.api.call("PATCH", f"/api/v1/nodes/{self.node_name}/status",
                                      {"status": {"conditions": update["conditions"]}},
                                      "application/strategic-merge-patch+json"))
        self.events.emit(update["events"])
        if self.repair(boot_id):
            # A reset's new epoch, a failed repair: the faults as they are now, written, before a
            # burn-in (the node just written is the one to compare with: no watch event to wait for).
            self.observe()
            if self.local is not None:
                self._reconcile_now()
            return
        if self.burn_in(pool, boot_id, verdict, faults, active, active_path):
            return
        if not faults and verdict is not None and verdict.get("passed") and self.pods_synced:
            self.active_check(pool, active, active_path, boot_id)

    def list_pods(self, consistent: bool) -> list:
        query = f"fieldSelector=spec.nodeName%3D{self.node_name}" + ("" if consistent else "&resourceVersion=0")
        return self.api.call("GET", f"/api/v1/pods?{query}").get("items", [])

    def active_check(self, pool: dict, state: dict | None, state_path: str, boot_id: str) -> None:
        """The GPU burn and NCCL all-reduce on an idle node, fenced by the preflight taint while they run."""
        settings = self.config.get("active") or {}
        due, _ = active_check_due(self.node, list(self.pods.values()), state, self.clock.time(), settings)
        if not due:
            return
        # No GPU pod may land while the GPUs burn: the preflight taint (one of
        # the two the agent may set) fences the node for the test's minutes.
        taints = list(self.node.get("spec", {}).get("taints") or [])
        fence = {"key": PREFLIGHT_TAINT, "value": ACTIVE_CHECK_FENCE, "effect": "NoSchedule",
                 "timeAdded": now(self.clock.time())}
        self._wrote(patch_taints(self.api, self.node, taints + [fence]))
        try:
            # A pod bound before the fence landed may not have reached the
            # watch yet: once a day, one consistent read of the node's pods.
            if classify.gpu_pods(self.list_pods(consistent=True)):
                return  # a GPU pod was bound between the look and the fence: leave it be
            diag = run_on_host(self.config, ["dcgmi", "diag", "-r", str(settings["dcgm_level"]), "-j"], timeout=1800)
            nccl = run_on_host(self.config, pool["nccl_command"], timeout=900) if pool.get("nccl_command") else None
            faults = classify.active_faults(diag, nccl, pool.get("nccl_min_bus_gbps"))
            write_json(state_path, active_state(state, boot_id, self.clock.time(), faults))
            ran = [name for name, result in (("dcgmi diag", diag), ("all_reduce_perf", nccl)) if result is not None]
            if faults:
                event = ("Warning", "GPUActiveCheckFailed", faults[0].message)
            elif ran:
                event = ("Normal", "GPUActiveCheckPassed", f"{' and '.join(ran)} passed on an idle node")
            else:
                event = ("Normal", "GPUActiveCheckSkipped", "neither dcgmi nor all_reduce_perf is installed on the host")
            self.events.emit([event])
        finally:
            # Lift the fence from the node as it is now (minutes passed: one
            # consistent read); a failure is tainted corral.dev/unhealthy next.
            node = self.api.call("GET", f"/api/v1/nodes/{self.node_name}")
            left = [t for t in node.get("spec", {}).get("taints") or []
                    if not (t.get("key") == PREFLIGHT_TAINT and t.get("value") == ACTIVE_CHECK_FENCE)]
            if len(left) != len(node.get("spec", {}).get("taints") or []):
                self._wrote(patch_taints(self.api, node, left))
            # What changed meanwhile (the check's state file) is looked at now, not in a round.
            self.observe()

    # -- repairs and burn-in (issue 27; docs/gpu-health.md) -------------------------------

    def _state_path(self, name: str) -> str:
        """A file of the agent's own state beside the preflight verdict (a hostPath: it outlives
        the pod and the boot)."""
        return os.path.join(os.path.dirname(self.config["verdict_path"]), name)

    def _annotate(self, key: str, value: dict) -> None:
        """Write one of the agent's annotations (a merge patch: no other key changes)."""
        self._wrote(self.api.call("PATCH", f"/api/v1/nodes/{self.node_name}",
                                  {"metadata": {"annotations": {key: json.dumps(value, sort_keys=True)}}},
                                  "application/merge-patch+json"))

    def _report_repair(self, record: dict) -> None:
        status = {"id": record["id"], "state": record["state"], "detail": record["detail"][:1000],
                  "at": record["at"]}
        if json_annotation(self.node, REPAIR_STATUS_ANNOTATION) != status:
            self._annotate(REPAIR_STATUS_ANNOTATION, status)
            if record["state"] != "running":
                self.events.emit([("Normal" if record["state"] == "done" else "Warning",
                                   "GPURepairDone" if record["state"] == "done" else "GPURepairFailed",
                                   f"{record['action']} {record['id']}: {record['detail']}")])

    def repair(self, boot_id: str) -> bool:
        """Carry out the controller's reset or reboot of this node, once per request id (see
        repair_step); whether the node's local state changed (look again before burning in)."""
        path = self._state_path("repair.json")
        record = read_json(path)
        request = json_annotation(self.node, REPAIR_ANNOTATION)
        step = repair_step(request, record, boot_id, self.clock.time())
        if step in ("none", "wait"):
            return False
        if step == "report":
            self._report_repair(record)
            return False
        stamp = now(self.clock.time())
        if step == "rebooted":
            record = dict(record, state="done", at=stamp,
                          detail=f"rebooted: boot {record['boot_id'][:8]} is now {boot_id[:8]}")
        elif step == "reboot-timed-out":
            record = dict(record, state="failed", at=stamp,
                          detail=f"the host did not reboot within {REBOOT_GRACE_SECONDS} s of systemctl reboot")
        elif step == REBOOT and not self.node.get("spec", {}).get("unschedulable"):
            # The controller cordons and drains before it asks; a request on a node in service (a
            # stray or forged annotation) would kill its jobs: refused, never carried out later.
            record = {"id": request["id"], "action": REBOOT, "state": "failed", "boot_id": boot_id, "at": stamp,
                      "detail": "refused: the node is not cordoned (the controller cordons and drains first)"}
        elif step == REBOOT:
            record = {"id": request["id"], "action": REBOOT, "state": "running", "boot_id": boot_id,
                      "started": self.clock.time(), "detail": "rebooting the host", "at": stamp}
            # Recorded and reported before the reboot: after it, the new boot id says it happened.
            write_json(path, record)
            self._report_repair(record)
            result = run_on_host(self.config, ["systemctl", "reboot"], timeout=60)
            if result is not None and result[0] == 0:
                return False            # the host goes down; the next boot's agent reports done
            record = dict(record, state="failed", at=now(self.clock.time()),
                          detail="systemctl reboot: " + ("not found on the host" if result is None
                                                         else f"exit {result[0]}"))
        else:
            record = {"id": request["id"], "action": RESET, "state": "running", "boot_id": boot_id,
                      "detail": "resetting the faulted GPUs", "at": stamp}
            write_json(path, record)
            self._report_repair(record)
            state, detail = self.reset_gpus(boot_id)
            record = dict(record, state=state, detail=detail, at=now(self.clock.time()))
        write_json(path, record)
        self._report_repair(record)
        return True

    def reset_gpus(self, boot_id: str) -> tuple[str, str]:
        """`nvidia-smi -r -i N` for each GPU this boot's Xids named, when the Xids allow it and no
        process holds the GPU: ("done" | "failed", why). nvidia-smi -h (driver 535): -r/--gpu-reset
        "Trigger reset of the GPU", -i/--id "Target a specific GPU"; --query-compute-apps lists
        "currently active compute processes"."""
        state_path = self._state_path("faults.json")
        state = read_json(state_path)
        state = state if state and state.get("boot_id") == boot_id else None
        gone = [f for f in self.device_faults if f.condition == classify.GPU_MISSING_CONDITION]
        if gone:
            return "failed", f"{gone[0].message}: a GPU off the bus needs a reboot, not a reset"
        refusal = classify.reset_refusal(xid_codes(state))
        if refusal:
            return "failed", refusal
        targets = faulted_gpus(state)
        if not targets:
            return "failed", "no Xid of this boot names a GPU: a reset must know which GPU (reboot instead)"
        keys = {classify.pci_key(p) for p in targets}
        listed = run_on_host(self.config, ["nvidia-smi", "--query-gpu=index,pci.bus_id",
                                           "--format=csv,noheader,nounits"], timeout=60)
        if listed is None or listed[0] != 0:
            return "failed", "nvidia-smi did not list the GPUs: not reset blind"
        index = {}
        for line in listed[1].splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2:
                index[classify.pci_key(fields[1])] = fields[0]
        absent = sorted(keys - set(index))
        if absent:
            return "failed", f"the GPU at {', '.join(absent)} is not visible to nvidia-smi: a reboot is needed"
        apps = run_on_host(self.config, ["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id",
                                         "--format=csv,noheader,nounits"], timeout=60)
        if apps is None or apps[0] != 0:
            return "failed", "nvidia-smi did not list the processes on the GPUs: not reset blind"
        holders = compute_apps_on(apps[1], keys)
        if holders:
            return "failed", f"processes {', '.join(holders[:5])} hold the GPU: no reset under a running process"
        gpus = sorted((index[key] for key in keys), key=lambda i: int(i) if i.isdigit() else 0)
        for gpu in gpus:
            result = run_on_host(self.config, ["nvidia-smi", "-r", "-i", gpu], timeout=300)
            if result is None or result[0] != 0:
                said = "" if result is None else result[1].strip()[:200]
                return "failed", f"nvidia-smi -r -i {gpu}: " + (f"exit {result[0]} {said}".strip() if result
                                                               else "not found on the host")
        # The kernel log's clock (/dev/kmsg stamps records with the monotonic clock since boot).
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)
        write_json(state_path, after_reset(state, boot_id, targets, usec))
        return "done", f"reset GPU {', '.join(gpus)} ({', '.join(targets)})"

    def burn_in(self, pool: dict, boot_id: str, verdict: dict | None, faults: list, active: dict | None,
                active_path: str) -> bool:
        """Burn the node in when it needs it (burn_in_due): behind corral.dev/burn-in=pending, DCGM at
        the cluster file's level and the one-node all-reduce against the pool's baseline; the result
        in the corral.dev/burn-in annotation, the taint lifted only on a pass. Whether it ran."""
        settings = self.config.get("burn_in") or {}
        if not settings.get("enabled"):
            return False
        burn_record = read_json(self._state_path("burn-in.json"))
        shown = json_annotation(self.node, BURN_IN_ANNOTATION)
        if (burn_record and burn_record.get("result") in FINISHED and shown != burn_record
                and (shown is None or shown.get("id") == burn_record.get("id"))):
            self._annotate(BURN_IN_ANNOTATION, burn_record)     # a lost write of the last result
        burn_id = burn_in_due(self.node, read_json(self._state_path("repair.json")), burn_record)
        if burn_id is None or verdict is None:
            return False        # nothing due, or this boot's preflight has not spoken yet
        join = burn_id == JOIN_BURN_IN_ID
        level = int(settings["dcgm_level"])
        if faults or not verdict.get("passed"):
            if join:
                return False    # the preflight and the fault taints hold a new node; burn in once they clear
            why = faults[0].message if faults else f"preflight {verdict.get('reason')}: {verdict.get('message')}"
            self._finish_burn_in({"id": burn_id, "result": "failed", "dcgmLevel": level, "dcgm": "not run",
                                  "busBwGBps": None, "baselineGBps": None, "percent": None,
                                  "detail": f"not burned in: the repair left a fault: {why}"[:1000]}, join)
            return True
        running = {"id": burn_id, "result": "running", "dcgmLevel": level, "at": now(self.clock.time())}
        self._wrote(patch_taints(self.api, self.node, burn_in_taints(self.node["spec"].get("taints") or [],
                                                                     "running", join)))
        write_json(self._state_path("burn-in.json"), running)
        self._annotate(BURN_IN_ANNOTATION, running)
        timeout = int(settings["timeout_seconds"])
        diag = run_on_host(self.config, ["dcgmi", "diag", "-r", str(level), "-j"], timeout=timeout)
        nccl = run_on_host(self.config, pool["nccl_command"], timeout=timeout) if pool["gpu_count"] > 1 else None
        result = classify.burn_in_verdict(diag, nccl, pool, level, float(settings["min_percent"]))
        self._finish_burn_in(dict(result, id=burn_id), join)
        if result["result"] == "passed":
            # The burn-in was a longer active check: the next idle one is due a full interval later.
            write_json(active_path, active_state(active, boot_id, self.clock.time(), []))
        return True

    def _finish_burn_in(self, result: dict, join: bool) -> None:
        result = dict(result, at=now(self.clock.time()))
        # Recorded on the host, then the result, then the taints: whoever sees the taints gone sees why.
        write_json(self._state_path("burn-in.json"), result)
        self._annotate(BURN_IN_ANNOTATION, result)
        # Minutes passed: the node as it is now (one consistent read), then only the agent's taints.
        node = self.api.call("GET", f"/api/v1/nodes/{self.node_name}")
        taints = node.get("spec", {}).get("taints") or []
        wanted = burn_in_taints(taints, result["result"], join)
        if wanted != taints:
            self._wrote(patch_taints(self.api, node, wanted))
        passed = result["result"] == "passed"
        self.events.emit([("Normal" if passed else "Warning", "GPUBurnInPassed" if passed else "GPUBurnInFailed",
                           f"burn-in {result['id']}: {result['detail']}")])

    # -- the loop ------------------------------------------------------------------------

    def start_watches(self) -> None:
        resync = float(self.config.get("resync_seconds", 3600))
        selectors = [("node", "/api/v1/nodes", f"metadata.name%3D{self.node_name}")]
        if (self.config.get("active") or {}).get("enabled"):
            selectors.append(("pods", "/api/v1/pods", f"spec.nodeName%3D{self.node_name}"))
        # One relist per node per resync period, the watches taking turns; the
        # first at a random point of the period, so a DaemonSet rollout's
        # agents never resync together.
        first = self.clock.monotonic() + self.rng.uniform(0, resync)
        for turn, (kind, path, selector) in enumerate(selectors):
            watch = Watch(self, kind, path, selector, first + turn * resync, resync * len(selectors))
            self.clock.spawn(watch.run)

    def stop(self) -> None:
        self.stopped = True
        self.inbox.put(STOP)

    def start_kernel_log(self) -> None:
        path = self.config.get("kernel_log", "/dev/kmsg")
        if followable(path):
            self.kernel_follower = KernelLogFollower(path, lambda lines: self.inbox.put(("kernel", lines)),
                                                     lambda: self.stopped)
            self.kernel_follower.start()

    def run(self) -> None:
        self.start_watches()
        self.start_kernel_log()
        interval, next_check = self.config["interval_seconds"], self.clock.monotonic()
        while True:
            # Until the node is listed there is nothing to check it against.
            timeout = None if self.node is None else max(0.0, next_check - self.clock.monotonic())
            try:
                item = self.inbox.get(timeout=timeout)
            except queue.Empty:
                item = None
            while item is not None:
                if item == STOP:
                    return
                self.take(item)
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    item = None
            try:
                if self.node is not None and self.clock.monotonic() >= next_check:
                    self.observe()
                    next_check = self.clock.monotonic() + interval
                elif self.node is not None and self.kernel_news:
                    self.observe_kernel()
                self.reconcile()
            except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
                # 409 from a resourceVersion race, an API server away: the next
                # change or round tries again.
                print(f"corral-gpu-health: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def once(api: Api, config: dict, node_name: str, clock=SystemClock) -> None:
    """One round from fresh reads (`--once`: debugging, tests): the same decisions and writes as the loop."""
    agent = Agent(api, config, node_name, clock)
    agent.node = api.call("GET", f"/api/v1/nodes/{node_name}")
    if (config.get("active") or {}).get("enabled"):
        agent.pods = {agent._pod_key(p): p for p in agent.list_pods(consistent=True)}
        agent.pods_synced = True
    agent.observe()
    agent.reconcile()


def main(argv: list[str]) -> int:
    config = json.load(open(os.environ.get("CORRAL_HEALTH_CONFIG",
                                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json"))))
    node_name = os.environ["NODE_NAME"]
    api = Api(user_agent=f"corral-gpu-health/{node_name}")
    if argv[1:] == ["--once"]:  # one round (debugging, tests)
        try:
            once(api, config, node_name)
            return 0
        except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
            print(f"corral-gpu-health: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            return 1
    Agent(api, config, node_name).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
