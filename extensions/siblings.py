"""Load `extensions/<name>.py` under a name unique to the template checkout it sits in.

Copier renders the old and the new template version in one process during an update; a
plain `import naming` would hand the new version's hook the old version's module. Each
extension reads this file with `runpy.run_path` (it cannot import it either) and calls
`load(__file__, name)`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load(anchor: str, name: str) -> ModuleType:
    """The module `<name>.py` beside the file `anchor`, executed once per checkout and
    kept in `sys.modules` as `_worker_template_<digest of the folder>_<name>`."""
    path = Path(anchor).resolve().with_name(f"{name}.py")
    digest = hashlib.sha1(str(path.parent).encode()).hexdigest()[:12]
    key = f"_worker_template_{digest}_{name}"
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return module
