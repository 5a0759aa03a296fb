"""The command line, through main(argv) and through the installed ``omnigraph`` command."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from omnigraph.cli import main

from conftest import FIXTURES, GRAPHS, ROOT

EXE = shutil.which("omnigraph", path=str(Path(sys.executable).parent)) or "omnigraph"


class TestCheck:
    def test_check_prints_the_plan_with_the_bound(self, capsys):
        assert main(["check", str(GRAPHS / "grpo_one_step_off.yaml")]) == 0
        out = capsys.readouterr().out
        assert "staleness bound: 1" in out and "trainer.0" in out

    @pytest.mark.parametrize("overrides,bound", [
        (["schedule.mode=sync", "schedule.max_staleness=0"], 0),
        (["schedule.mode=sync", "schedule.sync_every=2"], 1),
        ([], 1),
        (["schedule.sync_every=4", "schedule.max_staleness=4"], 4),
        (["schedule.mode=async", "schedule.ahead=3", "schedule.max_staleness=3"], 3),
    ])
    def test_check_json_reports_each_staleness_case(self, overrides, bound, capsys):
        g = str(GRAPHS / "synthetic_one_step_off.yaml")
        assert main(["check", g, *overrides, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["valid"] is True and report["staleness_bound"] == bound and report["errors"] == []

    def test_check_json_on_an_invalid_graph(self, capsys):
        assert main(["check", str(FIXTURES / "invalid" / "zero_delay_cycle.yaml"), "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["valid"] is False and report["staleness_bound"] is None
        assert "zero-delay cycle" in report["errors"][0]

    @pytest.mark.parametrize("fixture", ["typo_in_field", "unknown_node", "missing_pool", "zero_delay_cycle",
                                         "too_stale", "uneven_batch"])
    def test_mistakes_print_one_clear_message_and_exit_1(self, fixture, capsys):
        assert main(["check", str(FIXTURES / "invalid" / f"{fixture}.yaml")]) == 1
        captured = capsys.readouterr()
        assert captured.err.startswith("error: ") and "Traceback" not in captured.err
        assert captured.out == ""

    def test_json_for_a_missing_file(self, capsys):
        assert main(["check", "nope.yaml", "--json"]) == 1
        assert "no such file" in json.loads(capsys.readouterr().out)["errors"][0]


class TestVizAndRun:
    def test_viz_mermaid_prints_a_flowchart(self, capsys):
        assert main(["viz", str(GRAPHS / "grpo_one_step_off.yaml"), "-f", "mermaid"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("flowchart") and "old_logprob" in out

    def test_viz_png_and_timeline_write_pngs(self, tmp_path):
        g = str(GRAPHS / "grpo_one_step_off.yaml")
        assert main(["viz", g, "-f", "png", "-o", str(tmp_path / "g.png")]) == 0
        assert main(["viz", g, "--timeline", "-o", str(tmp_path / "t.png")]) == 0
        for name in ("g.png", "t.png"):
            assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_png_without_output_is_a_clear_error(self, capsys):
        assert main(["viz", str(GRAPHS / "grpo_one_step_off.yaml"), "-f", "png"]) == 1
        assert "add -o FILE.png" in capsys.readouterr().err

    def test_run_local_synthetic(self, tmp_path, capsys):
        code = main(["run", str(GRAPHS / "synthetic_one_step_off.yaml"), "schedule.iterations=3",
                     "nodes.generate.cost=0", "--executor", "local", "--run-dir", str(tmp_path), "--quiet"])
        assert code == 0
        out = capsys.readouterr().out
        assert "prompt groups trained 24/24" in out and "staleness max 1 (bound 1)" in out
        (run_dir,) = tmp_path.iterdir()
        assert (run_dir / "metrics.jsonl").exists()


class TestInstalledCommand:
    def test_check_through_the_console_script(self):
        p = subprocess.run([EXE, "check", "graphs/grpo_one_step_off.yaml"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "staleness bound: 1" in p.stdout

    def test_error_through_the_console_script_has_no_traceback(self):
        p = subprocess.run([EXE, "check", "tests/graphs/invalid/too_stale.yaml"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 1
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
        assert "schedule.max_staleness" in p.stderr


class TestResumeAndLedgerCommands:
    def test_resume_with_a_graph_is_refused(self, tmp_path, capsys):
        assert main(["run", str(GRAPHS / "grpo_one_step_off.yaml"), "--resume", str(tmp_path)]) == 1
        assert "--resume continues a run with its own config.yaml" in capsys.readouterr().err

    def test_resume_of_a_folder_that_is_no_run(self, tmp_path, capsys):
        assert main(["run", "--resume", str(tmp_path)]) == 1
        assert "is not a run directory (no config.yaml)" in capsys.readouterr().err

    def test_run_without_a_graph(self, capsys):
        assert main(["run"]) == 1
        assert "no graph given" in capsys.readouterr().err
