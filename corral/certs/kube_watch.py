"""List once, then watch: the API reads of corral-node-approver (issue 28, item 2).

Standard library only; it ships beside node_approver.py in the approver's
ConfigMap. At steady state a controller built on it makes no polling read at
all: it lists once from the API server's watch cache (resourceVersion=0),
then watches from the list's resourceVersion with bookmarks (the API server
moves the version on about once a minute, so a quiet watch resumes where it
was instead of relisting), resumes after each watch's timeout, relists from
etcd only on 410 Gone, and relists from the cache at a jittered resync
(resourceVersionMatch=NotOlderThan: never older than what it has seen).
API semantics: kubernetes/website content/en/docs/reference/using-api/
api-concepts.md ("Efficient detection of changes", "Watch bookmarks",
"Semantics for get and list", "resourceVersionMatch").

The same list-then-watch is what the GPU health agent does (corral/health/
agent.py, class Watch); that one is bound to the agent's state and was being
changed when this was written, so this is a copy in behaviour, not in code:
see docs/scale.md ("corral's other API clients").
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
import urllib.error

# client-go's reflector: watches end after 5 to 10 minutes (minWatchTimeout,
# tools/cache/reflector.go) so the API servers' watchers spread out.
WATCH_TIMEOUT_SECONDS = (300, 600)
RETRY_SECONDS = (1, 30)
# What a watch or list may fail with: the API server away, a reply cut short.
API_ERRORS = (urllib.error.URLError, OSError, ValueError, KeyError)


class SystemClock:
    """Real time and real threads: what the controller runs on in its pod. The seam
    lets tests run the same code through simulated hours (tests/health/simclock.py)."""

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


def take_waiting(inbox, timeout: float | None) -> list:
    """Everything in `inbox`: waits up to `timeout` (None: for ever) for the first item,
    then takes what else is there without waiting (a burst of events, one reconcile)."""
    items = []
    try:
        items.append(inbox.get(timeout=timeout))
        while True:
            items.append(inbox.get_nowait())
    except queue.Empty:
        return items


class ListWatch:
    """One collection, listed and then watched in its own thread; what it sees goes to
    `deliver` as ("sync", kind, items) after each list and ("event", kind, type, object)
    for each watch event (bookmarks only move the resourceVersion on).

    `list_query` and `watch_query` are the selectors (already URL-encoded); they may
    differ: a resourceVersion is the whole store's, so a watch may narrow what the list
    before it read (the approver lists every node, then watches only unlabelled ones).
    """

    def __init__(self, api, clock, rng, kind: str, path: str, *, list_query: str, watch_query: str,
                 deliver, stopped, resync_at: float, resync_seconds: float, name: str) -> None:
        self.api, self.clock, self.rng, self.kind, self.path = api, clock, rng, kind, path
        self.list_query, self.watch_query = list_query, watch_query
        self.deliver, self.stopped, self.name = deliver, stopped, name
        self.resync_at, self.resync_seconds = resync_at, resync_seconds
        self.rv: str | None = None
        self.gone = False

    @staticmethod
    def _join(*parts: str) -> str:
        return "&".join(p for p in parts if p)

    def _list(self) -> None:
        if self.gone:
            version = "resourceVersion="          # 410: a consistent read, from etcd
        elif self.rv is None:
            version = "resourceVersion=0"         # first list: the watch cache
        else:
            version = f"resourceVersion={self.rv}&resourceVersionMatch=NotOlderThan"
        answer = self.api.call("GET", f"{self.path}?{self._join(self.list_query, version)}")
        self.rv, self.gone = answer["metadata"]["resourceVersion"], False
        while self.resync_at <= self.clock.monotonic():
            self.resync_at += self.resync_seconds
        self.deliver(("sync", self.kind, answer.get("items") or []))

    def _watch(self) -> None:
        timeout = max(1, int(min(self.rng.uniform(*WATCH_TIMEOUT_SECONDS), self.resync_at - self.clock.monotonic())))
        query = self._join(self.watch_query, "watch=1&allowWatchBookmarks=true",
                           f"resourceVersion={self.rv}&timeoutSeconds={timeout}")
        with self.api.stream(f"{self.path}?{query}", timeout=timeout + 60) as response:
            while True:   # read to the end, also after an ERROR: the server closes the stream
                line = self.clock.blocking(response.readline)
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
                    self.deliver(("event", self.kind, event["type"], obj))

    def run(self) -> None:
        failures = 0
        while not self.stopped():
            try:
                if self.rv is None or self.clock.monotonic() >= self.resync_at:
                    self._list()
                self._watch()
                failures = 0
            except API_ERRORS as err:
                failures += 1
                print(f"{self.name}: {self.kind} watch: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
                if self.stopped():
                    return
                # Backed off and jittered: a restarted API server is not met by every client at once.
                self.clock.sleep(self.rng.uniform(RETRY_SECONDS[0], min(RETRY_SECONDS[1], 2 ** failures)))
