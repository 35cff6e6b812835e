"""`corral upgrade`: day-2 changes that reach running machines.

The order is the version skew policy's: the control plane first (one API
server at a time, behind health gates: `controlplane`), then the cloud pools
(their providers' rolling updates), then the on-prem nodes in batches through
playbooks/upgrade.yml (`onprem`). `versions` holds the skew rules, `plan` the
ordered plan `--check` prints. Cloud GPU pools, which no deploy rolls, are
drained and replaced a batch at a time (`cloudgpu`); `join_drain` gives
`corral join` the runner credential that drains serving GPU nodes before a
driver change. See docs/upgrades.md.
"""
