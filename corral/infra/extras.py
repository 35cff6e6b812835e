"""Which pip extra brings each cloud's Pulumi provider.

corral installs without any cloud (`pip install corral`); each cloud's
provider is an extra of pyproject.toml (`corral[aws]`, `corral[gcp]`,
`corral[azure]`, `corral[all]`), because the three together are most of a
full install (docs: README.md, "Install"). Asking whether a provider is
there finds its module without importing it: the providers are large and
the commands that never plan pay nothing for them.
"""

from __future__ import annotations

import importlib.util

# The module each provider package installs (PyPI pulumi-aws, pulumi-gcp,
# pulumi-azure-native; the import names their own docs use).
CLOUD_PROVIDERS = {"aws": "pulumi_aws", "azure": "pulumi_azure_native", "gcp": "pulumi_gcp"}


def install_hint(cloud: str) -> str:
    return f"pip install 'corral[{cloud}]'"


def provider_installed(cloud: str) -> bool:
    """Whether `cloud`'s Pulumi provider can be imported (True for a cloud without one)."""
    module = CLOUD_PROVIDERS.get(cloud)
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # blocked, or left as None in sys.modules
        return False


def missing_provider(error: ModuleNotFoundError, cloud: str) -> bool:
    """Whether `error` is `cloud`'s provider (or a module of it) not being installed."""
    module = CLOUD_PROVIDERS.get(cloud)
    return bool(module and error.name and error.name.split(".")[0] == module)
