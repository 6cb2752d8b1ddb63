"""A script of the repository (bench/, scripts/) imported as a module, for tests of its functions."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> ModuleType:
    """``relative`` (e.g. ``bench/doctor_heldout.py``) as a module named after its file, registered in
    ``sys.modules`` (dataclasses look their module up there)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
