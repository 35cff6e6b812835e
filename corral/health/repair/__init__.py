"""The GPU repair controller (issue 27): decide.py decides, controller.py acts. Both run in the
cluster from a ConfigMap beside the node agent's files (corral/manifests/repair.py), so they import
their neighbours as top-level modules, the way agent.py imports classify."""
