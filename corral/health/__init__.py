"""GPU health: preflight before work, passive checks, taints and remediation (docs/gpu-health.md)."""
