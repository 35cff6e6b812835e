"""pytest plugin: the ``hostlab`` marker and the hostlab fixtures.

Load it from the root conftest (``pytest_plugins = ["tests.hostlab.conftest_plugin"]``)
or from a test module's own ``pytest_plugins``.
"""

from .fixtures import (  # noqa: F401  (re-exported as fixtures)
    hostlab,
    hostlab_hosts,
    hostlab_repo,
    hostlab_repo_factory,
)

MARKER = ("hostlab: needs root and systemd-nspawn test hosts (tests/hostlab); "
          "skipped with a reason when the machine cannot run them")


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)
