"""apt at first boot: every boot script that installs packages includes scripts/apt-get.sh.j2."""

from __future__ import annotations

# Wait up to 10 min for the dpkg lock (unattended-upgrades), 5 tries 30 s apart.
APT_LOCK_TIMEOUT_SECONDS = 600
APT_ATTEMPTS = 5
APT_RETRY_SECONDS = 30


def apt_context() -> dict[str, int]:
    """What scripts/apt-get.sh.j2 (included by scripts that install packages) takes."""
    return {"apt_lock_timeout": APT_LOCK_TIMEOUT_SECONDS, "apt_attempts": APT_ATTEMPTS, "apt_retry_seconds": APT_RETRY_SECONDS}
