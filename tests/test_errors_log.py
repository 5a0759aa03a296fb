"""A node that raises: the console gets one line, the run directory's ``errors.log`` the whole traceback.

Each node failure is appended to ``errors.log`` (time, step, node, attempt, the message, the traceback down
to the file and line of the user's code that raised), on every executor: on Ray the failure crosses the
process boundary as a string (:meth:`NodeFailure.wire`) and keeps its traceback. The one-line message ends
with ``(traceback: RUN_DIR/errors.log)``.
"""

import pickle
import re

import pytest

import omnigraph as og
from omnigraph.cli import main
from omnigraph.errors import NodeFailure
from omnigraph.runtime import run
from omnigraph.testing import canonical_spec

from conftest import GRAPHS

USER_REWARD = '''def score(prompt, completion, **meta):
    scale = meta.get("scale")
    return completion.count("1") / scale       # scale is None: a TypeError, in the user's own code
'''
"""A user's reward function with a bug on line 3."""


@pytest.fixture
def user_reward(tmp_path, monkeypatch):
    """The user's module in a folder of its own, importable by the driver and (``PYTHONPATH``) Ray's actors."""
    folder = tmp_path / "usercode"
    folder.mkdir()
    (folder / "userreward.py").write_text(USER_REWARD)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    return folder / "userreward.py"


def entries(log) -> list[str]:
    """errors.log's entries, each from its ``===`` header line on."""
    return [part for part in re.split(r"^(?==== )", log.read_text(), flags=re.M) if part.strip()]


def user_plan(executor: str, *over: str):
    return og.compile(canonical_spec("one_step_off", iterations=4, executor=executor),
                      overrides=["nodes.reward.backend=python", "nodes.reward.fn=userreward:score", *over])


def check_user_traceback(entry: str, source, attempt: int) -> None:
    header = entry.splitlines()[0]
    assert re.fullmatch(rf"=== \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d  step 0  node reward  attempt {attempt} ===", header), \
        header
    assert "node reward failed at iteration 0: TypeError: unsupported operand type(s) for /" in entry
    assert "Traceback (most recent call last):" in entry
    assert f'File "{source}", line 3, in score' in entry, entry
    assert 'return completion.count("1") / scale' in entry


def test_a_users_reward_that_raises_leaves_its_traceback_in_errors_log_local(tmp_path, user_reward, capsys):
    """local: each attempt's failure is appended (one restart: two entries); the message points to the file."""
    with pytest.raises(NodeFailure) as failed:
        run(user_plan("local", "runtime.max_restarts=1"), run_dir=tmp_path / "runs", progress=False)
    (d,) = (tmp_path / "runs").iterdir()
    log = d / "errors.log"
    assert str(failed.value) == ("node reward failed at iteration 0: TypeError: unsupported operand type(s) for /: "
                                 f"'int' and 'NoneType' (after 1 restart(s)) (traceback: {log})")
    first, second = entries(log)
    check_user_traceback(first, user_reward, 1)
    check_user_traceback(second, user_reward, 2)

    capsys.readouterr()                            # the command line: one line on the console, exit 1
    assert main(["run", str(GRAPHS / "synthetic_one_step_off.yaml"), "schedule.iterations=4",
                 "nodes.reward.backend=python", "nodes.reward.fn=userreward:score", "--executor", "local",
                 "--quiet", "--run-dir", str(tmp_path / "cli")]) == 1
    err = capsys.readouterr().err
    (d,) = (tmp_path / "cli").iterdir()
    assert err.strip().splitlines() == [
        "error: node reward failed at iteration 0: TypeError: unsupported operand type(s) for /: 'int' and "
        f"'NoneType' (traceback: {d / 'errors.log'})"]
    check_user_traceback(*entries(d / "errors.log"), user_reward, 1)


def test_an_injected_fault_is_logged_at_its_step_and_the_restarted_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIGRAPH_INJECT", "reward@2:raise")
    res = run(og.compile(canonical_spec("one_step_off", iterations=4), overrides=["runtime.max_restarts=1"]),
              run_dir=tmp_path, progress=False)
    (entry,) = entries(res.run_dir / "errors.log")
    assert "  step 2  node reward  attempt 1 ===" in entry.splitlines()[0]
    assert "RuntimeError: injected fault in reward at step 2" in entry and "omnigraph/executors/faults.py" in entry


def test_a_failure_without_a_traceback_is_logged_and_the_message_does_not_point_to_it(tmp_path, monkeypatch):
    """A failure where nothing raised in a node (an actor's process gone, a step past its time) has no
    traceback: its entry says so, and the message stays as it was."""
    from omnigraph.executors.local import LocalExecutor

    def gone(self, start=0, barrier=None, stop=None):
        raise NodeFailure("update", 1, "actor trainer.0 died (its process exited)")
        yield
    monkeypatch.setattr(LocalExecutor, "steps", gone)
    with pytest.raises(NodeFailure) as failed:
        run(og.compile(canonical_spec("one_step_off", iterations=4)), run_dir=tmp_path, progress=False)
    assert str(failed.value) == "node update failed at iteration 1: actor trainer.0 died (its process exited)"
    (d,) = tmp_path.iterdir()
    (entry,) = entries(d / "errors.log")
    assert "  step 1  node update  attempt 1 ===" in entry and "(no traceback: nothing raised in a node" in entry


def test_the_traceback_survives_pickling_and_the_wire():
    try:
        int("x")
    except ValueError as e:
        failure = NodeFailure("reward", 3, e)
    assert 'int("x")' in failure.traceback
    for again in (pickle.loads(pickle.dumps(failure)), NodeFailure.from_message(failure.wire())):
        assert (str(again), again.node, again.iteration, again.traceback) == \
            (str(failure), "reward", 3, failure.traceback)


@pytest.mark.parametrize("executor", ["ray", pytest.param("ray-tasks", marks=pytest.mark.slow)])
def test_a_users_reward_that_raises_on_ray_leaves_its_traceback_in_errors_log(tmp_path, user_reward, executor,
                                                                              ray_session):
    """Ray: the reward runs in an actor's process; its traceback comes back with the failure (about 10 s on
    ``ray`` with the module's Ray instance; ``ray-tasks`` takes the same path, and runs with the slow tests)."""
    with pytest.raises(NodeFailure) as failed:
        run(user_plan(executor), run_dir=tmp_path / "runs", progress=False)
    (d,) = (tmp_path / "runs").iterdir()
    assert str(failed.value).endswith(f"(traceback: {d / 'errors.log'})")
    (entry,) = entries(d / "errors.log")
    check_user_traceback(entry, user_reward, 1)
