"""corral's GPU repair controller: one Deployment (`corral-repair`, 2 replicas), the leader acting
(issue 27, items 2 and 4; docs/gpu-health.md, "Automatic repair").

Standard library only: it runs as it is from a ConfigMap in the stock Python image the node agent
runs in, beside agent.py (whose API client, node watch, clock seam and event recorder it uses),
classify.py, repair_protocol.py and decide.py (the decisions, pure).

The loop, every retry period and on every Node change:
1. leader election through the Lease `corral-repair` in its namespace (config.json names it), client-go's
   tools/leaderelection semantics: a candidate takes the lease only when the record it last saw has
   not changed for a whole leaseDurationSeconds (time observed locally, so clock skew between
   replicas does not matter); the leader renews every retryPeriod and stops acting when it could not
   renew for renewDeadline. 15 s / 10 s / 2 s are Kubernetes' recommended defaults
   (k8s.io/component-base config/v1alpha1/defaults.go, RecommendedDefaultLeaderElectionConfiguration).
2. the leader reads the Nodes from its watch (agent.Watch: one list, then a watch with bookmarks;
   never a poll), asks decide.plan what to do, and writes only that: cordons (marked with
   corral.dev/cordoned-by), evictions (POST pods/NAME/eviction, policy/v1; 429 is a
   PodDisruptionBudget saying "not now": retried until the drain deadline, kubernetes/website
   concepts/scheduling-eviction/api-eviction.md), the repair annotation the node's agent acts on,
   replacements through the injected cloud call, readmissions, history and status ConfigMaps, events.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import random
import sys
import threading
import types
import urllib.error
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent
import decide
import repair_protocol as protocol

COMPONENT = "corral-repair"
DRAIN_RETRY_SECONDS = 5          # a draining node's pods are looked at again (429s retried) this often
MERGE_PATCH = "application/merge-patch+json"
RESUME_POLL_SECONDS = 10         # while stopped, the status ConfigMap is read again this often


class ApiError(Exception):
    """An API answer the controller acts on (404, 409, 429), with its code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP {code}: {message}")
        self.code = code


def call(api, method: str, path: str, body=None, content_type: str = "application/json") -> dict:
    """api.call, with the HTTP errors the controller decides on turned into ApiError."""
    try:
        return api.call(method, path, body, content_type)
    except urllib.error.HTTPError as err:
        raise ApiError(err.code, f"{method} {path}") from None


def micro_time(epoch: float) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds)."""
    whole = agent.now(int(epoch))[:-1]
    return f"{whole}.{int((epoch % 1) * 1e6):06d}Z"


class LeaderElector:
    """A Lease held the way client-go's leaderelection holds it (module docstring)."""

    def __init__(self, api, namespace: str, identity: str, clock, settings: dict) -> None:
        self.api, self.namespace, self.identity, self.clock = api, namespace, identity, clock
        self.duration = settings["lease_duration_seconds"]
        self.renew_deadline = settings["renew_deadline_seconds"]
        self.lease = settings["lease_name"]
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{self.lease}"
        self.observed_record: tuple | None = None
        self.observed_at = 0.0
        self.renewed_at: float | None = None      # our last successful write as leader

    @property
    def leading(self) -> bool:
        return self.renewed_at is not None and self.clock.monotonic() - self.renewed_at <= self.renew_deadline

    def _spec(self, old: dict | None) -> dict:
        now = self.clock.time()
        same = bool(old) and old.get("holderIdentity") == self.identity
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                "acquireTime": old.get("acquireTime") if same else micro_time(now),
                "renewTime": micro_time(now),
                "leaseTransitions": (old or {}).get("leaseTransitions", 0) + (0 if same or not old else 1)}

    def try_acquire_or_renew(self) -> bool:
        monotonic = self.clock.monotonic()
        try:
            lease = call(self.api, "GET", self.path)
        except ApiError as err:
            if err.code != 404:
                return self._lost()
            lease = None
        except (urllib.error.URLError, OSError, ValueError):
            return self._lost()
        try:
            if lease is None:
                call(self.api, "POST", f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases", {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.lease, "namespace": self.namespace}, "spec": self._spec(None)})
                self.renewed_at = monotonic
                return True
            spec = lease.get("spec") or {}
            record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
            if record != self.observed_record:
                self.observed_record, self.observed_at = record, monotonic
            holder = spec.get("holderIdentity")
            if holder and holder != self.identity and monotonic < self.observed_at + self.duration:
                self.renewed_at = None
                return False      # another replica holds it, and renewed within the lease
            call(self.api, "PUT", self.path, {**lease, "spec": self._spec(spec)})
            self.renewed_at = monotonic
            return True
        except ApiError:
            # 409: another replica wrote first; it leads.
            return self._lost()
        except (urllib.error.URLError, OSError, ValueError):
            return self._lost()

    def _lost(self) -> bool:
        if self.renewed_at is not None and self.clock.monotonic() - self.renewed_at > self.renew_deadline:
            self.renewed_at = None
        return self.leading


class ConfigMapStore:
    """One of the controller's ConfigMaps (rendered empty by the add-on; RBAC names them): read once
    when leading starts, then written through with the resourceVersion (409: read again)."""

    def __init__(self, api, namespace: str, name: str) -> None:
        self.api, self.path = api, f"/api/v1/namespaces/{namespace}/configmaps/{name}"
        self.obj: dict | None = None

    def load(self) -> dict:
        self.obj = call(self.api, "GET", self.path)
        return self.obj

    def data(self) -> dict[str, str]:
        return dict((self.obj or {}).get("data") or {})

    def write(self, data: dict[str, str], annotations: dict | None = None) -> None:
        obj = dict(self.obj or self.load())
        obj["data"] = data
        if annotations is not None:
            obj["metadata"] = dict(obj["metadata"], annotations=annotations)
        try:
            self.obj = call(self.api, "PUT", self.path, obj)
        except ApiError as err:
            if err.code == 409:
                self.load()
            raise


def post_event(api, clock, namespace: str, involved: dict, kind: str, reason: str, message: str) -> None:
    """One Event about a cluster-wide decision (the breaker, a rack), on the status ConfigMap."""
    when = agent.now(clock.time())
    call(api, "POST", f"/api/v1/namespaces/{namespace}/events", {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": involved, "type": kind, "reason": reason, "message": message[:1024],
        "source": {"component": COMPONENT}, "firstTimestamp": when, "lastTimestamp": when, "count": 1})


class Metrics:
    """What Prometheus scrapes (GPURepairCircuitBreakerOpen, GPURackCordoned in corral/health/rules.py)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leader = 0
        self.breaker_open = 0
        self.racks: dict[str, int] = {}
        self.actions: dict[str, int] = {}
        self.held = 0

    def count(self, action: str) -> None:
        with self.lock:
            self.actions[action] = self.actions.get(action, 0) + 1

    def text(self) -> str:
        with self.lock:
            lines = ["# HELP corral_repair_leader 1 when this replica leads.", "# TYPE corral_repair_leader gauge",
                     f"corral_repair_leader {self.leader}",
                     "# HELP corral_repair_circuit_breaker_open 1 while automatic repair is stopped.",
                     "# TYPE corral_repair_circuit_breaker_open gauge",
                     f"corral_repair_circuit_breaker_open {self.breaker_open}",
                     "# HELP corral_repair_rack_cordoned 1 for each failure domain cordoned as one unit.",
                     "# TYPE corral_repair_rack_cordoned gauge"]
            lines += [f'corral_repair_rack_cordoned{{domain="{d}"}} {v}' for d, v in sorted(self.racks.items())]
            lines += ["# HELP corral_repair_nodes_held Unhealthy nodes waiting (budget, breaker, rack, foreign cordon).",
                      "# TYPE corral_repair_nodes_held gauge", f"corral_repair_nodes_held {self.held}",
                      "# HELP corral_repair_actions_total Repair steps taken, by action.",
                      "# TYPE corral_repair_actions_total counter"]
            lines += [f'corral_repair_actions_total{{action="{a}"}} {v}' for a, v in sorted(self.actions.items())]
            return "\n".join(lines) + "\n"

    def serve(self, port: int, address: str = "") -> ThreadingHTTPServer:
        """/metrics on `address` (every address of the pod when empty: its own, on the pod network;
        on an API server's host network the node's, from CORRAL_REPAIR_METRICS_ADDRESS)."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = metrics.text().encode() if self.path == "/metrics" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


STOP = ("stop",)


class Controller:
    """The controller's state: the Nodes as its watch tells, its lease, its two ConfigMaps.

    agent.Watch runs against it as against an agent (api, clock, rng, inbox, stopped)."""

    def __init__(self, api, config: dict, identity: str, clock=agent.SystemClock, rng: random.Random | None = None,
                 replace=None) -> None:
        self.api, self.config, self.identity, self.clock = api, config, identity, clock
        self.rng = rng or random.Random()
        self.replace = replace                # replace(node: dict) -> None; raises when refused
        self.inbox = clock.queue()
        self.stopped = False
        self.nodes: dict[str, dict] = {}
        self.synced = False
        namespace = config["namespace"]
        self.elector = LeaderElector(api, namespace, identity, clock, config["leader_election"])
        self.history = ConfigMapStore(api, namespace, protocol.HISTORY_CONFIGMAP)
        self.status = ConfigMapStore(api, namespace, config["status_configmap"])
        self.loaded = False
        self.status_read_at = 0.0
        self.next_drain: dict[str, float] = {}
        self.events: dict[str, agent.EventRecorder] = {}
        self.metrics = Metrics()

    # -- the watch ---------------------------------------------------------------------------

    def take(self, item: tuple) -> None:
        if item[0] == "sync":
            self.nodes = {n["metadata"]["name"]: n for n in item[2]}
            self.synced = True
            return
        _, _, event_type, obj = item
        if event_type == "DELETED":
            self.nodes.pop(obj["metadata"]["name"], None)
        else:
            self.nodes[obj["metadata"]["name"]] = obj

    def _wrote(self, node: dict) -> None:
        if node.get("metadata", {}).get("name"):
            self.nodes[node["metadata"]["name"]] = node

    # -- helpers --------------------------------------------------------------------------------

    def event(self, node: str, kind: str, reason: str, message: str) -> None:
        recorder = self.events.setdefault(node, agent.EventRecorder(self.api, node, self.clock))
        recorder.emit([(kind, reason, message)])

    def patch_node(self, name: str, annotations: dict | None = None, unschedulable: bool | None = None,
                   resource_version: str | None = None) -> dict:
        """A merge patch of the node's annotations and cordon; with `resource_version`, only if the
        node did not change since (409 otherwise: the next round decides again)."""
        body: dict = {"metadata": {}}
        if annotations is not None:
            body["metadata"]["annotations"] = annotations
        if resource_version:
            body["metadata"]["resourceVersion"] = resource_version
        if unschedulable is not None:
            body["spec"] = {"unschedulable": unschedulable}
        node = call(self.api, "PATCH", f"/api/v1/nodes/{name}", body, MERGE_PATCH)
        self._wrote(node)
        return node

    def history_of(self, name: str) -> list:
        try:
            value = json.loads(self.history.data().get(name, "[]"))
        except ValueError:
            return []
        return value if isinstance(value, list) else []

    def all_history(self) -> dict:
        return {name: self.history_of(name) for name in self.history.data()}

    def record(self, view: decide.NodeView, outcome: str) -> None:
        data = self.history.data()
        entries = self.history_of(view.name) + [decide.history_entry(view, outcome, self.clock.time())]
        data[view.name] = json.dumps(entries[-50:], sort_keys=True)
        self.history.write(data)

    def stopped_by_status(self) -> bool:
        status = self.status_dict()
        return bool(status["breaker"].get("open") or status["racks"])

    def status_dict(self) -> dict:
        data = self.status.data()
        return {"breaker": decide.loads(data.get("breaker")) or {}, "racks": decide.loads(data.get("racks")) or {},
                "resumedAt": data.get("resumedAt")}

    # -- one round --------------------------------------------------------------------------------

    def reconcile(self) -> None:
        monotonic = self.clock.monotonic()
        if not self.loaded:
            self.history.load()
            self.status.load()
            self.loaded, self.status_read_at = True, monotonic
        elif self.stopped_by_status() and monotonic - self.status_read_at >= RESUME_POLL_SECONDS:
            # Stopped (breaker open, a rack out): only a person's resume annotation restarts it, so
            # look at the ConfigMap again now and then; never while repairing normally.
            self.status.load()
            self.status_read_at = monotonic
        now = self.clock.time()
        pools = self.config["pools"]
        views = [v for v in (decide.view(n, pools) for n in self.nodes.values()) if v is not None]
        status = self.status_dict()
        resume = decide.RESUME_ANNOTATION in ((self.status.obj or {}).get("metadata", {}).get("annotations") or {})
        result = decide.plan(views, self.all_history(), status, self.config, now,
                             can_replace=self.replace is not None, resume_requested=resume)
        by_name = {v.name: v for v in views}
        self._status_changes(result, status, now)
        for name in result.release:
            self.patch_node(name, {decide.CORDON_ANNOTATION: None}, unschedulable=False)
            self.event(name, "Normal", "RepairRackReleased", "its failure domain was released by a person")
        for name in result.readmit:
            self.readmit(by_name[name])
        for name, reason in result.cordon:
            self.cordon(by_name[name], reason, now)
        for name in result.drain:
            self.drain(by_name[name], views, now)
        for name, action, why in result.escalate:
            self.start_repair(by_name[name], action, why, views, escalated=True)
        self.metrics.leader, self.metrics.held = 1, len(result.held)

    def _status_changes(self, result: decide.Plan, status: dict, now: float) -> None:
        involved = {"apiVersion": "v1", "kind": "ConfigMap", "name": self.config["status_configmap"],
                    "namespace": self.config["namespace"]}
        if not (result.resume or result.trip or result.racks):
            self.metrics.breaker_open = int(bool(status["breaker"].get("open")))
            self.metrics.racks = {d: 1 for d in status["racks"]}
            return
        data = self.status.data()
        annotations = dict((self.status.obj or {}).get("metadata", {}).get("annotations") or {})
        breaker, racks = status["breaker"], dict(status["racks"])
        if result.resume:
            breaker, racks = {"open": False}, {}
            data["resumedAt"] = decide.stamp(now)
            annotations.pop(decide.RESUME_ANNOTATION, None)
        if result.trip:
            breaker = {"open": True, "since": decide.stamp(now), "reason": result.trip}
        for domain, entry in result.racks.items():
            racks[domain] = {**entry, "since": decide.stamp(now)}
        data["breaker"], data["racks"] = json.dumps(breaker, sort_keys=True), json.dumps(racks, sort_keys=True)
        self.status.write(data, annotations)
        # Events after the status is written: a restarted leader never repeats them.
        if result.resume:
            post_event(self.api, self.clock, self.config["namespace"], involved, "Normal", "RepairResumed",
                       "automatic repair resumed by a person; cordoned failure domains released")
        if result.trip:
            post_event(self.api, self.clock, self.config["namespace"], involved, "Warning", "RepairCircuitBreakerOpen",
                       f"automatic repair stopped cluster-wide: {result.trip}. Resume: kubectl -n "
                       f"{self.config['namespace']} annotate configmap {self.config['status_configmap']} "
                       f"{decide.RESUME_ANNOTATION}=now")
        for domain, entry in result.racks.items():
            for name in entry["nodes"]:
                node = self.nodes.get(name, {})
                if not (node.get("spec") or {}).get("unschedulable"):
                    self.patch_node(name, {decide.CORDON_ANNOTATION: decide.RACK_CORDON}, unschedulable=True)
            self.metrics.count("rack-cordon")
            post_event(self.api, self.clock, self.config["namespace"], involved, "Warning", "RepairRackCordoned",
                       f"{domain} cordoned as one unit, no per-node repairs: {entry['reason']}")
        self.metrics.breaker_open = int(bool(breaker.get("open")))
        self.metrics.racks = {d: 1 for d in racks}

    def cordon(self, node: decide.NodeView, reason: str, now: float) -> None:
        episode = decide.new_episode(reason, now, self.config["drain_timeout_seconds"])
        self.patch_node(node.name, {decide.CORDON_ANNOTATION: decide.REPAIR_CORDON,
                                    decide.EPISODE_ANNOTATION: json.dumps(episode, sort_keys=True)},
                        unschedulable=True)
        self.metrics.count("cordon")
        self.event(node.name, "Warning", "RepairCordoned", f"cordoned for repair, draining: {reason}"[:1000])

    def drain(self, node: decide.NodeView, views: list, now: float) -> None:
        monotonic = self.clock.monotonic()
        if monotonic < self.next_drain.get(node.name, 0):
            return
        self.next_drain[node.name] = monotonic + DRAIN_RETRY_SECONDS
        pods = call(self.api, "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node.name}").get("items", [])
        left = []
        for pod in pods:
            if not needs_eviction(pod):
                continue
            meta = pod["metadata"]
            left.append(f"{meta['namespace']}/{meta['name']}")
            if meta.get("deletionTimestamp"):
                continue      # evicted already, terminating
            try:
                call(self.api, "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction",
                     {"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": meta["name"], "namespace": meta["namespace"]}})
                self.metrics.count("eviction")
            except ApiError as err:
                if err.code == 404:
                    left.pop()          # gone meanwhile
                elif err.code not in (429, 500):
                    raise
                # 429: a PodDisruptionBudget allows no disruption now; 500: two budgets name the pod.
        episode = dict(node.episode or {})
        if not left:
            self.next_drain.pop(node.name, None)
            action, why = decide.first_action(node, self.history_of(node.name), self.config, now)
            self.start_repair(node, action, why, views, escalated=False)
            return
        if now >= (decide.parse_time(episode.get("deadline")) or now):
            episode["drain"] = "timed-out"
            self.patch_node(node.name, {decide.EPISODE_ANNOTATION: json.dumps(episode, sort_keys=True)})
            self.next_drain.pop(node.name, None)
            self.record(node, "drain-timed-out")
            self.event(node.name, "Warning", "RepairDrainTimedOut",
                       f"drain did not finish by {episode.get('deadline')} ({len(left)} pods left, e.g. "
                       f"{', '.join(left[:3])}; PodDisruptionBudgets refuse): the node stays cordoned, unrepaired, "
                       f"for a person")

    def start_repair(self, node: decide.NodeView, action: str, why: str, views: list, escalated: bool) -> None:
        """Write the repair the node's agent carries out (reset, reboot), or carry it out (replace), or
        quarantine (rma). Written with the node's resourceVersion: a node that changed meanwhile is
        decided again next round."""
        episode = dict(node.episode or {})
        if escalated:
            self.record(node, "failed")
        episode["drain"] = "done"
        episode["tried"] = list(episode.get("tried") or []) + [action]
        repair = {"id": str(uuid.uuid4()), "action": action, "requested": decide.stamp(self.clock.time()),
                  "reason": why}
        if action == protocol.REPLACE:
            refusal = decide.replace_refusal(node, views)
            if refusal:
                action, why = protocol.RMA, f"replace refused: {refusal}"
                repair.update(action=action, reason=why)
                episode["tried"][-1] = action
        self.patch_node(node.name, {protocol.REPAIR_ANNOTATION: json.dumps(repair, sort_keys=True),
                                    decide.EPISODE_ANNOTATION: json.dumps(episode, sort_keys=True)},
                        resource_version=node.resource_version)
        self.metrics.count(action)
        if action == protocol.RMA:
            self.event(node.name, "Warning", "RepairRMA", f"quarantined for RMA, stays cordoned: {why}")
            self.record(node, "rma")
        elif action == protocol.REPLACE:
            self.replace_now(node, repair, episode)
        else:
            self.event(node.name, "Normal" if not escalated else "Warning", "RepairRequested",
                       f"{action} requested ({why})"[:1000])

    def replace_now(self, node: decide.NodeView, repair: dict, episode: dict) -> None:
        status = {"id": repair["id"], "at": decide.stamp(self.clock.time())}
        try:
            self.replace(self.nodes[node.name])
            status.update(state="done", detail="the instance left its group, which starts a fresh one")
            self.event(node.name, "Normal", "RepairReplaced", status["detail"])
        except Exception as err:  # noqa: BLE001  (the cloud's refusal, whatever its type: recorded, escalated)
            status.update(state="failed", detail=f"replace failed: {type(err).__name__}: {err}"[:300])
            self.event(node.name, "Warning", "RepairReplaceFailed", status["detail"])
        self.patch_node(node.name, {protocol.REPAIR_STATUS_ANNOTATION: json.dumps(status, sort_keys=True)})
        if status["state"] == "done":
            done = decide.NodeView(**{**node.__dict__, "repair": repair, "episode": episode})
            self.record(done, "replaced")

    def readmit(self, node: decide.NodeView) -> None:
        """Uncordon after a passed burn-in of this repair id (decide.may_readmit), then forget the repair."""
        self.patch_node(node.name, {protocol.REPAIR_ANNOTATION: None, decide.EPISODE_ANNOTATION: None,
                                    decide.CORDON_ANNOTATION: None},
                        unschedulable=False, resource_version=node.resource_version)
        self.record(node, "readmitted")
        self.metrics.count("readmit")
        self.event(node.name, "Normal", "RepairReadmitted",
                   f"{(node.repair or {}).get('action')} and burn-in passed (repair {(node.repair or {}).get('id')}): "
                   f"uncordoned")

    # -- the loop -------------------------------------------------------------------------------

    def start_watch(self) -> None:
        resync = float(self.config.get("resync_seconds", 3600))
        first = self.clock.monotonic() + self.rng.uniform(0, resync)
        self.clock.spawn(agent.Watch(self, "node", "/api/v1/nodes", "", first, resync).run)

    def stop(self) -> None:
        self.stopped = True
        self.inbox.put(STOP)

    def _take_all(self, timeout: float) -> bool:
        """Everything the watch brought, waiting up to `timeout` for the first; False once stopped."""
        get = functools.partial(self.inbox.get, timeout=timeout)
        while True:
            try:
                item = get()
            except queue.Empty:
                return True
            if item == STOP:
                return False
            self.take(item)
            get = self.inbox.get_nowait

    def run(self) -> None:
        self.start_watch()
        retry = self.config["leader_election"]["retry_period_seconds"]
        next_election = self.clock.monotonic()
        while self._take_all(max(0.0, next_election - self.clock.monotonic())):
            try:
                if self.clock.monotonic() >= next_election:
                    was = self.elector.leading
                    self.elector.try_acquire_or_renew()
                    next_election = self.clock.monotonic() + retry
                    if was and not self.elector.leading:
                        self.loaded = False     # someone else leads now: read again when we lead again
                        self.metrics.leader = 0
                if self.elector.leading and self.synced:
                    self.reconcile()
            except (ApiError, urllib.error.URLError, OSError, ValueError, KeyError) as err:
                # A 409 from a race, an API server away: the next round decides again from fresh state.
                if isinstance(err, ApiError) and err.code == 409:
                    self.loaded = False
                print(f"corral-repair: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def needs_eviction(pod: dict) -> bool:
    """Pods a drain evicts: not DaemonSet pods (kubectl drain's --ignore-daemonsets), not static
    (mirror) pods, not finished ones."""
    meta = pod.get("metadata") or {}
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class CloudReplacer:
    """`replace(node)` through the node's pool's groups, with the API servers' cloud identity
    (cloud_api.py, shipped beside this file for clusters with cloud GPU pools). It acts only on an
    instance that corral.health.instances' rules allow: the groups are the cluster file's (names,
    region, zones; project, subscription and resource group the API servers' own), never the
    node's; the cloud's API, asked read-only (find_instance), says a running instance of one of
    them has the node's name; and the node's providerID names that same instance. (No two Nodes
    claiming one instance: decide.replace_refusal, before this is called.)"""

    def __init__(self, cloud_api, session, pools: dict) -> None:
        self.cloud_api, self.session, self.pools = cloud_api, session, pools

    def groups(self, pool: str) -> list:
        return self.cloud_api.pool_groups((self.pools.get(pool) or {}).get("groups", []), self.session.identity())

    def __call__(self, node: dict) -> None:
        meta = node["metadata"]
        name, pool = meta["name"], (meta.get("labels") or {}).get(decide.POOL_LABEL, "")
        claimed = ((node.get("spec") or {}).get("providerID") or "").rstrip("/").rsplit("/", 1)[-1]
        for group in self.groups(pool):
            instance = self.cloud_api.find_instance(group, name, session=self.session)
            if instance is None:
                continue
            if not instance.running:
                raise self.cloud_api.CloudApiError(f"{name}'s instance {instance.instance_id} in {group.name} is "
                                                   f"{instance.state}, not running: not replaced")
            if instance.instance_id != claimed:
                raise self.cloud_api.CloudApiError(
                    f"{name}'s providerID names {claimed or 'no instance'}, the {group.provider} API says its "
                    f"instance in {group.name} is {instance.instance_id}: not replaced")
            target = types.SimpleNamespace(group=group, claim=types.SimpleNamespace(instance=instance.instance_id,
                                                                                     zone=instance.zone))
            self.cloud_api.replace_instance(target, session=self.session)
            return
        raise self.cloud_api.CloudApiError(f"no instance of pool {pool}'s groups is named {name}: not replaced")


def cloud_replace(config: dict):
    """The replace call of a cluster with cloud GPU pools (cloud_api.py beside this file); None
    otherwise: cloud nodes then go from a failed reboot to RMA."""
    if not config.get("cloud"):
        return None
    try:
        import cloud_api
    except ImportError:
        return None
    return CloudReplacer(cloud_api, cloud_api.CloudSession.from_metadata(config["cloud"]), config["pools"])


def main(argv: list[str]) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.environ.get("CORRAL_REPAIR_CONFIG", os.path.join(here, "config.json"))) as fh:
        config = json.load(fh)
    identity = os.environ.get("POD_NAME") or f"corral-repair-{uuid.uuid4().hex[:8]}"
    api = agent.Api(user_agent=f"{COMPONENT}/{identity}")
    controller = Controller(api, config, identity, replace=cloud_replace(config))
    controller.metrics.serve(int(config.get("metrics_port", 9402)), os.environ.get("CORRAL_REPAIR_METRICS_ADDRESS", ""))
    controller.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
