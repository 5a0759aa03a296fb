"""The ledger of a run: every prompt group trained (or dropped) exactly once; while the run has not finished,
the groups not yet trained that its newest checkpoint holds (or that came after it) are in flight, not lost.

Real runs: one preempted with SIGTERM (exit 75 and a checkpoint, as a cluster's early warning does), one
stopped by a node failure after its checkpoint, and finished ones; a finished run stays strict.
"""

import json
import signal
from pathlib import Path

import pytest

import omnigraph as og
from omnigraph.cli import main
from omnigraph.errors import NodeFailure
from omnigraph.runtime import run
from omnigraph.runtime.interrupt import EXIT_PREEMPTED
from omnigraph.runtime.ledger import format_summary, read, summarize

from cli_process import omnigraph
from conftest import GRAPHS

SYNTH = str(GRAPHS / "synthetic_one_step_off.yaml")
PARTIAL = ["nodes.generate.partial={budget_tokens: 1, max_spans: 3}", "schedule.max_staleness=3"]
SYNTHETIC_DATA = [f"nodes.{n}.backend=synthetic" for n in ("generate", "old_logprob", "update", "sync")]


def stepped(parent: Path, n: int):
    """True once a run under ``parent`` has written ``n`` steps."""
    return lambda: any(p.read_text().count("\n") >= n for p in parent.glob("*/metrics.jsonl"))


def ledger_events(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "ledger.jsonl").read_text().splitlines()]


def not_yet_trained(d: Path) -> set[int]:
    events = ledger_events(d)
    return ({e["group"] for e in events if e["event"] == "generated"}
            - {e["group"] for e in events if e["event"] in ("trained", "dropped")})


@pytest.mark.parametrize("over", [[], PARTIAL], ids=["one_step_off", "partial"])
def test_a_preempted_run_counts_the_groups_its_checkpoint_holds_as_in_flight_not_lost(tmp_path, capsys, over):
    """SIGTERM after 2 steps: the checkpoint holds the groups generated and not yet trained (the one-step-off
    edge's buffer; unfinished partial rollouts), the ledger counts them as in flight and exits 0; the same
    command continues the run and the finished run's ledger has every group trained once."""
    job = ["run", SYNTH, "schedule.iterations=12", *over, "--executor", "local", "--quiet",
           "--run-dir", str(tmp_path)]
    code, _, err, _, _, _ = omnigraph(job, [(stepped(tmp_path, 2), signal.SIGTERM)])
    assert code == EXIT_PREEMPTED, err
    (d,) = tmp_path.iterdir()
    (point,) = (d / "checkpoints").iterdir()
    waiting = not_yet_trained(d)
    assert waiting and json.loads((point / "manifest.json").read_text())["in_flight_groups"] == sorted(waiting)

    assert main(["ledger", str(d)]) == 0
    out = capsys.readouterr().out
    assert f"in flight at checkpoint: {len(waiting)} (kept in {point.name}: a resume trains them)" in out, out
    assert "lost (never trained):    0" in out and "ledger: OK so far" in out and "NOT OK" not in out
    s = read(d)
    assert s.ok and not s.finished and (s.in_flight, s.lost) == (len(waiting), 0)
    assert s.trained_once + s.in_flight == s.generated
    assert main(["ledger", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["in_flight"] == len(waiting)

    assert main(job) == 0                                     # the job again: it continues the run to its end
    s = read(d)
    assert s.finished and s.ok and s.in_flight == s.lost == 0 and s.generated == s.trained_once > len(waiting)


def test_a_run_stopped_after_its_checkpoint_counts_the_newer_groups_in_flight_and_names_rows(tmp_path, monkeypatch,
                                                                                            capsys):
    """A node fails at step 7 (checkpoint after step 5): the groups of step 6 came after the checkpoint (a
    resume generates them again), so they are in flight too; with prompts from data the rows say the same,
    and a row the data's filters left out is named as such, not as dropped."""
    rows = [{"number": str(1000 + i), "answer": str(1000 + i)} for i in range(40)]
    rows[3]["answer"] = ""                                    # no answer: left out by the data's filters
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    over = [f"task.source={data}", "task.epochs=null", "task.split=train", "task.eval_split=null", "task.prompts=4",
            "schedule.iterations=9", "checkpoint.every=3", "runtime.executor=local", "nodes.generate.eval_every=0",
            *SYNTHETIC_DATA]
    monkeypatch.setenv("OMNIGRAPH_INJECT", "update@7:raise")
    with pytest.raises(NodeFailure):
        run(og.compile(GRAPHS / "grpo_dataset.yaml", overrides=over), run_dir=tmp_path / "runs", progress=False)
    (d,) = (tmp_path / "runs").iterdir()
    s = read(d)
    made_6 = {e["group"] for e in ledger_events(d) if e["event"] == "generated" and e["step"] == 6}
    assert not_yet_trained(d) == made_6 and len(made_6) == 4
    assert s.ok and (s.in_flight, s.in_flight_since, s.lost, s.checkpoint) == (0, 4, 0, "step-00000005")
    assert len(s.rows["in_flight"]) == 4 and s.rows["dropped"] == [] and s.rows["left_out"] == [3]
    assert main(["ledger", str(d)]) == 0
    out = capsys.readouterr().out
    assert "in flight since then:    4 (the run goes on with them, or a resume generates them again)" in out
    assert "rows dropped, too stale: 0\n" in out and "rows in flight:          4 (rows " in out
    assert "rows left out by filters: 1 (rows 3)\n" in out


def test_a_group_neither_trained_nor_in_flight_is_lost_finished_or_not(tmp_path, capsys):
    """A finished run's ledger is strict: a group never trained is lost (exit 1). An unfinished one counts
    only the groups its checkpoint holds (or that came after it) as in flight: one trained before the
    checkpoint and missing from the ledger is still lost."""
    assert main(["run", SYNTH, "schedule.iterations=4", "checkpoint.every=2", "--executor", "local", "--quiet",
                 "--run-dir", str(tmp_path)]) == 0
    (d,) = tmp_path.iterdir()
    assert read(d).ok and read(d).finished and main(["ledger", str(d)]) == 0
    lines = (d / "ledger.jsonl").read_text().splitlines(keepends=True)
    first = next(i for i, x in enumerate(lines) if json.loads(x)["event"] == "trained")
    (d / "ledger.jsonl").write_text("".join(lines[:first] + lines[first + 1:]))
    capsys.readouterr()
    assert main(["ledger", str(d)]) == 1
    out = capsys.readouterr().out
    assert "lost (never trained):    1" in out and out.rstrip().endswith("ledger: NOT OK") and "in flight" not in out

    (d / "summary.json").unlink()                               # as if the run had stopped after its checkpoint
    s = read(d)
    assert not s.finished and s.checkpoint is not None and s.lost == 1 and not s.ok
    assert main(["ledger", str(d)]) == 1


def test_groups_dropped_too_stale_rows_in_flight_and_rows_left_out_are_worded_apart():
    data = {"split": {"range": [0, 6], "left_out": [5]}}
    made = [{"event": "generated", "group": g, "step": 0, "row": g, "epoch": 0} for g in range(4)]
    events = made + [{"event": "trained", "group": 0}, {"event": "dropped", "group": 1, "reason": "stale"}]
    s = summarize(events, data, finished=False,
                  checkpoint={"name": "step-00000000", "ledger_lines": 4, "in_flight_groups": [2, 3]})
    assert s.ok and (s.in_flight, s.lost, s.dropped) == (2, 0, {"stale": 1})
    text = format_summary(s)
    for line in ("dropped:                 1 too stale", "in flight at checkpoint: 2 (kept in step-00000000",
                 "rows dropped, too stale: 1 (rows 1)", "rows in flight:          2 (rows 2, 3)",
                 "rows never reached:      1 (rows 4)", "rows left out by filters: 1 (rows 5)"):
        assert line in text, text
    assert "rows lost" not in text
    finished = summarize(events, data)                          # the same ledger of a finished run: 2 lost
    assert not finished.ok and finished.lost == 2 and finished.rows["lost"] == [2, 3]
    assert "rows lost:               2 (rows 2, 3)" in format_summary(finished)
