"""`corral usage`: GPU-hours, GPUs requested vs used and reserved-pool
occupancy per team, from the monitoring add-on's recorded series
(corral/manifests/monitoring.py) through Prometheus' HTTP API. docs/monitoring.md
says how each number is computed."""
