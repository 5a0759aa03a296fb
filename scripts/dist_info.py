"""Make omnigraph's entry points visible where it is not pip-installed (the GPU machine runs it from the
checkout on PYTHONPATH): write ``omnigraph-<version>.dist-info`` with ``METADATA`` and ``entry_points.txt``
from ``pyproject.toml`` into a folder on the path.

    python3 scripts/dist_info.py DIR
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write(target: Path) -> Path:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = target / f"{project['name']}-{project['version']}.dist-info"
    shutil.rmtree(info, ignore_errors=True)
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, points in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in points.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    return info


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
