"""Editing cluster files in place: the text a reviewer sees changes only where it must.

`corral nodepool add|scale|remove` and `corral cluster new` come through here.
Every edit works on the file's text, not on a re-dumped tree: ruamel.yaml's
round-trip parser reports where every node starts and ends, the edit splices
new text in at those places, and everything else (comments, key order,
quoting, blank lines, odd indentation) stays byte for byte. Re-dumping the
whole tree would re-flow long lines, move comment columns and normalise
indentation across the file; a one-pool change would then be a whole-file
diff.

New text (a pool, a list item, a value) is written in the file's own style:
the indentation found in the file, flow or block collections as the other
pools use them, the file's quote character, the key order of the sibling
pools, and a blank line between pools when the file has them.

Each operation checks itself: the edited text is re-read and must hold
exactly the data intended (`EditError` otherwise, which would be a bug
here); `validate_edit` then runs the model's file and fleet rules over the
result before anything is written.

The modules, each owning one part:
- `errors`: `EditError` and the shared pool keys (`POOLS_KEY`, `CANONICAL_POOL_KEYS`).
- `spans`: where things are: the span tree from ruamel's parser, and text helpers.
- `style`: how the file writes things, and rendering new text in that style.
- `splice`: splicing new text in at the spans, and checking the data it produces.
- `pools`: node pool operations and team reservations of pools.
- `validate`: model and fleet checks of the edited text before writing; the diff.
- `new_cluster`: scaffolding the text of a new cluster file.
"""

from __future__ import annotations

from .errors import CANONICAL_POOL_KEYS, POOLS_KEY, EditError
from .new_cluster import DEFAULT_KUBERNETES, SCAFFOLD_DEFAULTS, fleet_networks, new_cluster_text
from .pools import add_pool, pool_data, pool_document, pools_of, remove_pool, reserve_pool, update_pool
from .spans import Node
from .style import Style, detect_style, render_scalar
from .validate import unified_diff, validate_edit

__all__ = [
    "CANONICAL_POOL_KEYS",
    "DEFAULT_KUBERNETES",
    "POOLS_KEY",
    "SCAFFOLD_DEFAULTS",
    "EditError",
    "Node",
    "Style",
    "add_pool",
    "detect_style",
    "fleet_networks",
    "new_cluster_text",
    "pool_data",
    "pool_document",
    "pools_of",
    "remove_pool",
    "render_scalar",
    "reserve_pool",
    "unified_diff",
    "update_pool",
    "validate_edit",
]
