"""What `pulumi up` runs (Pulumi.yaml: `main: corral/infra/`): the program in program.py."""

import os
import sys

# Pulumi runs this folder as a script folder, which puts it first on
# sys.path; its modules would then shadow others by their bare names
# (platform.py the standard library's `platform`, aws/ azure/ gcp/ any
# top-level packages of those names). Take it off, and make sure the
# checkout this file lives in is importable when corral is not installed.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
_ROOT = os.path.dirname(os.path.dirname(_HERE))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from corral.infra.program import run  # noqa: E402  (after the sys.path fix above)

run()
