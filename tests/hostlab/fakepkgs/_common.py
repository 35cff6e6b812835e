# ---- shared fake plumbing (inlined into every fake at package build time) ----
import os
import shlex
import sys

#: Build-time constants (versions, default GPUs); replaced by aptrepo.py.
BUILD = {}  # @@BUILD@@ (replaced by aptrepo.render_fake)

#: Prefix for every absolute path the fake touches.  Empty on a test host;
#: unit tests on the lab machine point it at a temporary directory.
FAKE_ROOT = os.environ.get("CORRAL_FAKE_ROOT", "")


def P(path):
    """Path of ``path`` under FAKE_ROOT."""
    return FAKE_ROOT + path


def log_argv(prog):
    """Append this invocation to /var/log/corral-fakes/<prog>.log (one line)."""
    try:
        os.makedirs(P("/var/log/corral-fakes"), exist_ok=True)
        with open(P(f"/var/log/corral-fakes/{prog}.log"), "a") as fh:
            fh.write(shlex.join([prog] + sys.argv[1:]) + "\n")
    except OSError:
        pass


def fake_conf(name):
    """key=value settings a test may drop into /etc/corral-fakes/<name>."""
    conf = {}
    try:
        with open(P(f"/etc/corral-fakes/{name}")) as fh:
            for line in fh:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    conf[k.strip()] = v.strip()
    except OSError:
        pass
    return conf


def forced_failure(name):
    """If /etc/corral-fakes/<name> exists, its text is an error to fail with."""
    try:
        with open(P(f"/etc/corral-fakes/{name}")) as fh:
            return fh.read().strip() or f"{name}: forced failure"
    except OSError:
        return None


def die(msg, code=1):
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.exit(code)


def daemonize(pidfile):
    """Classic double fork for Type=forking units; returns in the daemon."""
    if os.fork() > 0:
        # parent: wait until the daemon wrote its pid file, as real daemons do
        import time
        for _ in range(100):
            if os.path.exists(pidfile):
                os._exit(0)
            time.sleep(0.02)
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.makedirs(os.path.dirname(pidfile), exist_ok=True)
    with open(pidfile + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()}\n")
    os.rename(pidfile + ".tmp", pidfile)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)


def sleep_forever():
    """Idle like a daemon until SIGTERM/SIGINT; exit 0 then."""
    import signal
    import time
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)
# ---- end of shared fake plumbing ----
