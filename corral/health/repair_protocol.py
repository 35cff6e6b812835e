"""The annotations and taints through which the repair controller and the node agent work together
(issue 27; docs/gpu-health.md, automatic repair). Plain constants: the agent ships as a single file
beside classify.py, so it copies these values; tests check the two agree.

The controller writes REPAIR after it cordoned and drained a node; the agent carries out `reset` and
`reboot`, reports in REPAIR_STATUS, then burns the node in and reports in BURN_IN; the controller
uncordons only after a passed burn-in of the same repair id.
"""

from __future__ import annotations

REPAIR_ANNOTATION = "corral.dev/repair"                # controller -> agent: {"id", "action", "requested", "reason"}
REPAIR_STATUS_ANNOTATION = "corral.dev/repair-status"  # agent -> controller: {"id", "state", "detail", "at"}
BURN_IN_ANNOTATION = "corral.dev/burn-in"              # agent -> controller: {"id", "result", ...}
BURN_IN_TAINT = "corral.dev/burn-in"                   # agent-managed: pending|failed, NoSchedule

# Actions, cheapest first: the controller picks the cheapest one the fault allows.
RESET = "reset"        # nvidia-smi -r by the node's agent, no process may hold the GPU
REBOOT = "reboot"      # the node's agent reboots its own host (no ssh from the cluster)
REPLACE = "replace"    # cloud: the instance leaves its group, which starts a fresh one
RMA = "rma"            # quarantine: a repeat offender waits for a person and a vendor ticket
ACTIONS = (RESET, REBOOT, REPLACE, RMA)

REPAIR_STATES = ("running", "done", "failed")
BURN_IN_RESULTS = ("running", "passed", "failed")
JOIN_BURN_IN_ID = "join"   # the burn-in of a new node carries this id

RACK_LABEL = "corral.dev/rack"
REPAIR_NAMESPACE = "corral-repair"
HISTORY_CONFIGMAP = "corral-repair-history"
