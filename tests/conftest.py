import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ROOT / "graphs"
FIXTURES = Path(__file__).parent / "graphs"

os.chdir(ROOT)                      # dotted paths like nodes.rewards.rules:digits_match resolve from the repo root
sys.path.insert(0, str(ROOT))


def expectations(path: Path, key: str) -> list[str]:
    """The ``# key: value`` lines at the top of a fixture."""
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(f"# {key}:"):
            out.append(line.split(":", 1)[1].strip())
    return out


@pytest.fixture(scope="module")
def ray_session():
    """One Ray cluster for a module's in-process runs (an executor joins it instead of starting its own and
    shutting it down: seconds each on a small host). 64 logical CPUs: random graphs may ask for many small
    actors; their synthetic nodes cost nothing."""
    import ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=64, include_dashboard=False, logging_level="ERROR", configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture
def tmp_runs(tmp_path):
    return tmp_path / "runs"
