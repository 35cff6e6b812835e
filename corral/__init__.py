"""corral: GPU Kubernetes clusters across Azure, AWS, GCP and your own data centres."""

__version__ = "0.1.0"
