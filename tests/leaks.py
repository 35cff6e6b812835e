"""pytest plugin: a test that leaves a thread or a child process running fails.

A watch thread one test started against a fake API server once printed its
time-out into another test's captured output, and failed that test instead
(issue 34). Every test stops the threads and servers it starts; this plugin
makes the test that does not fail, naming the thread and where it runs.

Fixtures of module or session scope are set up before this function-scoped
autouse fixture takes its snapshot, so their threads (shared real servers) are
not counted against the test; they must stop them in their own teardown. A child
process (a real etcd, Prometheus, an HTTP server) counts the same way as a thread.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback

import pytest

# A thread the test stopped may need a moment to finish its last loop.
GRACE_SECONDS = float(os.environ.get("CORRAL_TEST_LEAK_GRACE_SECONDS", "5"))


def _where(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "(no frame)"
    stack = traceback.extract_stack(frame)
    # The innermost frame of the project's own code says what it was doing.
    own = [f for f in stack if "/corral/" in f.filename or "/tests/" in f.filename] or stack
    last = own[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"


# Threads a library starts once per process and reuses in every later test, not a test's
# leak: the idle workers of an event loop's default executor (named asyncio_N by asyncio;
# Pulumi's runtime under the mocks runs its calls there) and gRPC's completion-queue poller.
PROCESS_WIDE_NAMES = re.compile(r"asyncio_\d+")
PROCESS_WIDE_TARGETS = ("_poll_wrapper",)


def process_wide(thread: threading.Thread) -> bool:
    target = getattr(getattr(thread, "_target", None), "__name__", "")
    return bool(PROCESS_WIDE_NAMES.fullmatch(thread.name)) or target in PROCESS_WIDE_TARGETS


def leaked_threads(before: set[int], grace: float = GRACE_SECONDS) -> list[threading.Thread]:
    """Threads alive now that were not in `before`, after waiting up to `grace` s for them to end."""
    deadline = time.monotonic() + grace
    new = [t for t in threading.enumerate() if t.ident not in before and t is not threading.current_thread()
           and not process_wide(t)]
    for thread in new:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in new if t.is_alive()]


def _children() -> dict[int, str]:
    """This process's running children (not zombies): pid -> command line."""
    me, found = str(os.getpid()), {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                stat = fh.read()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if ppid != me or state == "Z":
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                found[int(entry.name)] = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
        except (OSError, ValueError, IndexError):
            continue
    return found


def leaked_children(before: set[int], grace: float = GRACE_SECONDS) -> dict[int, str]:
    deadline = time.monotonic() + grace
    while True:
        new = {pid: cmd for pid, cmd in _children().items() if pid not in before}
        if not new or time.monotonic() >= deadline:
            return new
        time.sleep(0.1)


def exempt(item) -> bool:
    """Tests on throwaway hosts (marker hostlab) share hosts, apt repositories and fake API
    servers across a module or session, started by the first test that needs them and torn
    down by the lab (tests/hostlab); the check is for everything else."""
    return bool(item.get_closest_marker("allow_thread_leak") or item.get_closest_marker("hostlab"))


@pytest.fixture(autouse=True)
def _no_thread_left_running(request):
    if exempt(request.node):
        yield
        return
    before = {t.ident for t in threading.enumerate()}
    children = set(_children())
    yield
    problems = []
    leaked = leaked_threads(before)
    if leaked:
        problems.append(f"{len(leaked)} thread(s): " + "; ".join(f"{t.name} at {_where(t)}" for t in leaked))
    processes = leaked_children(children)
    if processes:
        problems.append(f"{len(processes)} child process(es): " + "; ".join(
            f"pid {pid} {cmd}" for pid, cmd in sorted(processes.items())))
    if problems:
        pytest.fail("left running by this test: " + " | ".join(problems), pytrace=False)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "allow_thread_leak(reason): a test whose library starts a process-wide thread it never stops")
