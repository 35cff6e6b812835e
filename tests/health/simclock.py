"""TEST FAKE: simulated time for the health agent and the fake API server.

Hours of an agent's life in seconds: nothing sleeps in real time. Every
thread that takes part (the agents' loops and watch threads, the fake API
server's watch handlers) waits only through this clock; when all of them
wait and no watch line is on its way through a socket, the clock jumps to
the earliest deadline (a sleep's end, a `get(timeout)`, a watch's bookmark
or end, a scheduled change to the simulated cluster) and wakes who waits
for it. A watch line counts as on its way from the moment the server queues
it until the agent's read of it returns (`blocking`), so the clock never
moves past an event still in a socket.

It implements the agent's clock seam (corral/health/agent.py SystemClock:
monotonic, time, sleep, queue, spawn, blocking) and what the fake API
server needs (lock, now, enter/leave, wait, notify, add_transit).
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading

WALL_START = 1_800_000_000.0   # the simulated wall clock's epoch seconds at t=0


class SimulationStopped(BaseException):
    """Raised in every thread that waits on a stopped clock, so it unwinds and ends.

    A BaseException: the agent's and the controllers' loops catch Exception and retry,
    which here would spin; this one goes past them to the thread's top."""


class _Waiter:
    __slots__ = ("cond", "registered", "generation")

    def __init__(self, lock) -> None:
        self.cond = threading.Condition(lock)
        self.registered = False
        self.generation = 0


class SimClock:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._now = 0.0
        self._active = 0
        self._transit = 0
        self._deadlines: list = []          # (deadline, seq, waiter, generation)
        self._timers: list = []             # (when, seq, callback)
        self._seq = itertools.count()
        self._quiet = threading.Condition(self.lock)
        self._waiting: set[_Waiter] = set()
        self.stopped = False
        self.error: BaseException | None = None

    # -- the agent's seam ----------------------------------------------------------

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return WALL_START + self._now

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.wait(None, lambda: False, self._now + seconds)

    def queue(self) -> SimQueue:
        return SimQueue(self)

    def spawn(self, target) -> None:
        with self.lock:
            self._active += 1

        def run() -> None:
            try:
                target()
            except SimulationStopped:
                pass
            except BaseException as err:  # noqa: BLE001  (surfaced by run_until)
                self.error = self.error or err
            finally:
                self.leave()

        threading.Thread(target=run, daemon=True).start()

    def blocking(self, read):
        """A read of a watch stream: idle while it waits; the line it returns was in transit."""
        with self.lock:
            self._active -= 1
            self._check()
        try:
            return read()
        finally:
            with self.lock:
                self._active += 1
                self._transit -= 1

    # -- the fake API server's side ----------------------------------------------------

    def enter(self) -> None:
        with self.lock:
            self._active += 1

    def leave(self) -> None:
        with self.lock:
            self._active -= 1
            self._check()

    def add_transit(self, lines: int) -> None:
        """Lines queued for a watch stream (caller holds the lock)."""
        self._transit += lines

    def wait(self, channel, ready, deadline: float | None) -> None:
        """Wait (lock held) until ready() or the deadline; `notify(channel)` wakes early."""
        waiter = _Waiter(self.lock)
        if channel is not None:
            channel._sim_waiter = waiter
        self._waiting.add(waiter)
        try:
            while not ready() and (deadline is None or self._now < deadline):
                if self.stopped:
                    raise SimulationStopped
                waiter.registered = True
                waiter.generation += 1
                if deadline is not None:
                    heapq.heappush(self._deadlines, (deadline, next(self._seq), waiter, waiter.generation))
                self._active -= 1
                self._check()
                while waiter.registered:
                    waiter.cond.wait()
        finally:
            self._waiting.discard(waiter)
            if channel is not None:
                channel._sim_waiter = None

    def stop(self) -> None:
        """End the simulation: every thread waiting on this clock, now or later, gets
        SimulationStopped and ends (a test must leave no thread running)."""
        with self.lock:
            self.stopped = True
            for waiter in list(self._waiting):
                self._wake(waiter)

    def notify(self, channel) -> None:
        """Wake who waits on `channel` (lock held): counted active from now."""
        waiter = getattr(channel, "_sim_waiter", None)
        if waiter is not None:
            self._wake(waiter)

    def _wake(self, waiter: _Waiter) -> None:
        if waiter.registered:
            waiter.registered = False
            self._active += 1
            waiter.cond.notify()

    def _check(self) -> None:
        if self._active == 0 and self._transit == 0:
            self._quiet.notify()

    # -- the driver ------------------------------------------------------------------

    def at(self, when: float, callback) -> None:
        """Run callback() (a change to the simulated cluster) at simulated time `when`."""
        with self.lock:
            heapq.heappush(self._timers, (when, next(self._seq), callback))

    def run_until(self, end: float, real_timeout: float = 600) -> None:
        """Advance simulated time to `end`, running everything due on the way."""
        with self.lock:
            while True:
                if not self._quiet.wait_for(lambda: self._active == 0 and self._transit == 0, timeout=real_timeout):
                    raise RuntimeError(f"simulation stuck at t={self._now:.1f}: {self._active} active, "
                                       f"{self._transit} lines in transit")
                if self.error:
                    raise RuntimeError(f"a simulated thread failed: {self.error!r}") from self.error
                while self._deadlines and not (self._deadlines[0][2].registered
                                               and self._deadlines[0][3] == self._deadlines[0][2].generation):
                    heapq.heappop(self._deadlines)
                candidates = [t for t in (self._deadlines[0][0] if self._deadlines else None,
                                          self._timers[0][0] if self._timers else None) if t is not None]
                step = min(candidates) if candidates else None
                if step is None or step > end:
                    self._now = max(self._now, end)
                    return
                self._now = max(self._now, step)
                while self._deadlines and self._deadlines[0][0] <= self._now:
                    _, _, waiter, generation = heapq.heappop(self._deadlines)
                    if waiter.generation == generation:
                        self._wake(waiter)
                while self._timers and self._timers[0][0] <= self._now:
                    _, _, callback = heapq.heappop(self._timers)
                    self._active += 1
                    self.lock.release()
                    try:
                        callback()
                    finally:
                        self.lock.acquire()
                        self._active -= 1


class SimQueue:
    """queue.Queue's get/put/get_nowait, waiting in simulated time."""

    def __init__(self, clock: SimClock) -> None:
        self.clock, self.items = clock, []
        self._sim_waiter = None

    def put(self, item) -> None:
        with self.clock.lock:
            self.items.append(item)
            self.clock.notify(self)

    def get(self, timeout: float | None = None):
        with self.clock.lock:
            deadline = None if timeout is None else self.clock.now() + timeout
            self.clock.wait(self, lambda: bool(self.items), deadline)
            if not self.items:
                raise queue.Empty
            return self.items.pop(0)

    def get_nowait(self):
        with self.clock.lock:
            if not self.items:
                raise queue.Empty
            return self.items.pop(0)


class RealClock:
    """The fake API server's clock when the agent runs in real time (the hostlab test)."""

    def __init__(self) -> None:
        import time

        self._monotonic = time.monotonic
        self.lock = threading.Lock()
        self._changed = threading.Condition(self.lock)

    def now(self) -> float:
        return self._monotonic()

    def enter(self) -> None:
        pass

    def leave(self) -> None:
        pass

    def add_transit(self, lines: int) -> None:
        pass

    def wait(self, channel, ready, deadline: float | None) -> None:
        """Wait (lock held) a little: callers loop, and the file-backed fake looks at its file between."""
        if not ready():
            left = 0.2 if deadline is None else max(0.0, min(0.2, deadline - self.now()))
            self._changed.wait(timeout=left)

    def notify(self, channel) -> None:
        self._changed.notify_all()
