"""Import a file of scripts/ as a module in tests (scripts/ is not a package)."""
import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(filename: str):
    """The module defined by ``scripts/<filename>``, executed once per call."""
    spec = importlib.util.spec_from_file_location(Path(filename).stem, SCRIPTS / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
