"""`corral doctor CLUSTER`: everything a real `corral up` and `corral join` need,
checked before anything changes, each finding with the command that fixes it.

Every check is a small function that reads (the cluster model, the stack
file, read-only CLI calls through one runner with a timeout) and returns
findings: pass, warn, fail or skip, a one-line finding and a one-line fix.
Nothing here writes a file or calls anything that changes the cloud, the
backend or a host. docs/doctor.md lists each check, what it calls and where
each command and field comes from.
"""

from .checks import Finding, Status, exit_code
from .run import run_checks

__all__ = ["Finding", "Status", "exit_code", "run_checks"]
