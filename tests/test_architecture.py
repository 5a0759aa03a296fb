"""The architecture is a test (docs/architecture.md): layers and forbidden imports as import-linter
contracts, no import circles, imports inside functions only for heavy optional dependencies, built-ins
registered through the same entry points a user's package uses."""

import ast
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import grimp
import networkx as nx
import pytest

import omnigraph as og
from omnigraph import plugins
from omnigraph.errors import GraphError

from conftest import GRAPHS, ROOT

HEAVY = {"torch", "transformers", "tokenizers", "peft", "vllm", "gguf", "safetensors", "matplotlib", "tensorboard",
         "wandb", "mlflow", "datasets", "reasoning_gym", "math_verify", "ray", "numba", "llvmlite", "omnigraph.transports.collectives", "omnigraph.transports.groups", "omnigraph.transports.pack",
         "omnigraph.transports.delta", "fastapi", "uvicorn", "openai", "nodes.rollout.agents",
         "omnigraph.viz.plots", "omnigraph.viz.png", "omnigraph.viz.gantt"}
"""What may be imported inside a function: packages that take seconds to import (or are optional extras),
and our modules that import them at their top, so that ``omnigraph check`` and synthetic graphs never pay."""


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "broken" in done.stdout and " 0 broken" in done.stdout


def test_the_contracts_name_every_engine_module():
    """A module added to the engine must be placed in the layers (or it would escape every contract)."""
    text = (ROOT / "pyproject.toml").read_text()
    tops = {p.stem if p.is_file() else p.name for p in (ROOT / "omnigraph").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    missing = sorted(t for t in tops if f'"omnigraph.{t}' not in text)
    assert not missing, f"modules missing from [tool.importlinter] in pyproject.toml: {missing}"


def test_there_are_no_import_circles():
    graph = grimp.build_graph("omnigraph", "nodes")
    g = nx.DiGraph()
    for m in graph.modules:
        g.add_edges_from((m, i) for i in graph.find_modules_directly_imported_by(m)
                         if i.split(".")[0] in ("omnigraph", "nodes"))
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == []


def function_imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for f in ast.walk(ast.parse(path.read_text())):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(f):
                if isinstance(n, ast.Import):
                    out += [(n.lineno, a.name) for a in n.names]
                elif isinstance(n, ast.ImportFrom):
                    base = n.module or ""
                    if n.level:        # relative: resolve against the file's package
                        pkg = list(path.relative_to(ROOT).with_suffix("").parts)[:-n.level]
                        base = ".".join(pkg + ([base] if base else []))
                    out.append((n.lineno, base))
    return out


def test_imports_inside_functions_are_only_for_heavy_optional_dependencies():
    bad = []
    for path in sorted((ROOT / "omnigraph").rglob("*.py")) + sorted((ROOT / "nodes").rglob("*.py")):
        for line, module in function_imports(path):
            if not any(module == h or module.startswith(h + ".") for h in HEAVY):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


class TestRegistry:
    def test_the_built_ins_come_through_entry_points(self):
        backends = {ep.name for ep in entry_points(group="omnigraph.backends")}
        assert {"generate.hf", "generate.vllm", "generate.synthetic", "update.torch", "sync.torch"} <= backends
        assert {"digits", "arithmetic"} <= set(plugins.names("tasks"))
        assert {"shm", "cuda-ipc", "nccl", "host", "channel"} <= set(plugins.names("transports"))
        assert {"tiny", "smollm2-135m"} <= set(plugins.names("models"))

    def test_every_descriptor_names_a_class_of_its_kind(self):
        for name in plugins.names("backends"):
            kind = name.split(".")[0]
            b = plugins.load("backends", name)
            assert b.kind == kind, name
            assert plugins.load_dotted(b.impl) is not None

    def test_a_typo_in_a_backend_gets_a_did_you_mean(self):
        with pytest.raises(GraphError) as e:
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.generate.backend=vlm"])
        assert e.value.where == "nodes.generate.backend"
        assert "unknown generate backend 'vlm' (did you mean 'vllm'?" in str(e.value)

    def test_a_typo_in_a_task_or_reward_names_the_field(self):
        with pytest.raises(GraphError, match=r"task.name: unknown task 'digit' \(did you mean 'digits'"):
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["task.name=digit"])
        with pytest.raises(GraphError, match=r"nodes.reward.fn: .*did you mean 'digits_match'"):
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.reward.fn=digit_match"])

    def test_the_engine_does_not_import_node_code_to_check_a_graph(self):
        # the backends' descriptor modules (the role packages' light __init__), the task class whose options it
        # checks, the reward function the graph names and the trainer's memory check; no node implementation,
        # no torch
        code = ("import sys, omnigraph as og; og.compile('graphs/grpo_one_step_off.yaml'); "
                "print(sorted(m for m in sys.modules if m.startswith('nodes.')), 'torch' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["['nodes.rewards',", "'nodes.rewards.rules',", "'nodes.rollout',", "'nodes.tasks',",
                                      "'nodes.tasks.procedural',", "'nodes.trainer',", "'nodes.trainer.memory']",
                                      "False"], out.stdout


def test_the_engine_names_no_node_module():
    """The contracts keep ``omnigraph/`` from importing node code; this keeps it from naming it, even in a string
    or a docstring: the engine finds backends, tasks and rewards by their registered names only."""
    import re
    module = re.compile(r"\bnodes[./](rollout|trainer|rewards|tasks|envs|models|zoo|diffusion|synthetic)\b")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in sorted((ROOT / "omnigraph").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if module.search(line)]
    assert not hits, "\n".join(hits)
