"""`corral diff`: what a change to cluster files means, in the model and in the cloud.

- `semantic.py`: pools added/removed/resized, versions, etcd disk... from two resolved models;
- `resources.py`: two offline Pulumi plans -> create / update / replace / delete, dangers first;
- `replacements.py`: the sourced table of which input changes force a replacement;
- `engine.py`: git revision vs working tree, both sides planned; `report.py`: text, markdown, JSON.

Importing this package is cheap; Pulumi is imported only when a plan runs.
"""
