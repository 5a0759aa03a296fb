"""``runtime.loggers: [tensorboard, wandb, mlflow]``: every step's metrics and the run's parameters, read back from
what each logger wrote; each step once after a restart or a resume."""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from omnigraph.cli import main
from omnigraph.planning import compile as og_compile
from omnigraph.errors import GraphError

from conftest import GRAPHS, ROOT

SYNTH = str(GRAPHS / "synthetic_one_step_off.yaml")


def scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def one_run(tmp_path, *overrides):
    assert main(["run", SYNTH, "nodes.generate.cost=0", "runtime.loggers=[tensorboard]", *overrides,
                 "--executor", "local", "--run-dir", str(tmp_path), "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, rows


def test_every_numeric_metric_reaches_tensorboard(tmp_path):
    run_dir, rows = one_run(tmp_path, "schedule.iterations=6")
    want = [(r["step"], r["reward_mean"]) for r in rows if "reward_mean" in r]
    got = scalars(run_dir, "reward_mean")
    assert [s for s, _ in got] == [s for s, _ in want]
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(got, want))
    assert len(scalars(run_dir, "timing_s/update")) == sum("timing_s/update" in r for r in rows)


def test_a_restarted_run_shows_each_step_once(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIGRAPH_INJECT", "update@7:raise")
    run_dir, rows = one_run(tmp_path, "schedule.iterations=10", "checkpoint.every=4", "runtime.max_restarts=1")
    assert (run_dir / "restarts.jsonl").exists()
    steps = [s for s, _ in scalars(run_dir, "step_s")]
    assert steps == sorted(set(steps)) == [r["step"] for r in rows], steps


# ---------------------------------------------------------------- wandb, mlflow: read back what each wrote

EXE = shutil.which("omnigraph", path=str(Path(sys.executable).parent)) or "omnigraph"
ALL = "runtime.loggers=[tensorboard, wandb, mlflow]"


def clean_env(tmp_path) -> dict[str, str]:
    """No W&B or MLflow settings of the machine's user; W&B's own config and cache kept in ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "OMNIGRAPH_INJECT"))}
    env.update(WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
               WANDB_DATA_DIR=str(tmp_path / "wandb-data"), NETRC=str(tmp_path / "no-netrc"))
    return env


def omnigraph_run(tmp_path, *args, env=None, want_rc=0, timeout=300):
    """``omnigraph run`` in its own process: it must also exit (W&B's and MLflow's exit hooks must not hang)."""
    done = subprocess.run([EXE, "run", *args, "--quiet"], cwd=ROOT, env=env or clean_env(tmp_path),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == want_rc, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def wandb_records(run_dir):
    """Every record of the run's offline W&B files (``wandb/offline-run-*/run-*.wandb``), oldest file first.

    The file is a LevelDB-style log (7-byte header ``:W&B`` + magic + version, then 32 KiB blocks of records
    with a 7-byte header: crc32, length, type full/first/middle/last) of ``wandb_internal_pb2.Record``s."""
    from wandb.proto import wandb_internal_pb2 as pb
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, list((run_dir / "wandb").iterdir())
    out = []
    for f in files:
        data = f.read_bytes()
        assert data[:4] == b":W&B"
        pos, block, part = 7, 32768, b""
        while pos + 7 <= len(data):
            left = block - pos % block
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if left < 7 or (length == 0 and kind == 0):
                pos += left
                continue
            part += data[pos + 7:pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):                 # a full record, or the last piece of one
                rec = pb.Record()
                rec.ParseFromString(part)
                out.append((f, rec))
                part = b""
    return out


def wandb_read(run_dir):
    """(run ids, config, history rows) of the run's W&B files."""
    ids, config, history = set(), {}, []
    for _, rec in wandb_records(run_dir):
        kind = rec.WhichOneof("record_type")
        items = []
        if kind == "run":
            ids.add(rec.run.run_id)
            items = rec.run.config.update
        elif kind == "config":
            items = rec.config.update
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return ids, config, history


def mlflow_client(run_dir, monkeypatch):
    from mlflow.tracking import MlflowClient
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    kept = json.loads((run_dir / "loggers.json").read_text())["mlflow"]
    assert kept["tracking_uri"] == (run_dir / "mlruns").resolve().as_uri()
    return MlflowClient(kept["tracking_uri"]), kept["run_id"]


def series(rows, key):
    return [(r["step"], r[key]) for r in rows if key in r]


def test_every_logger_gets_the_metrics_and_the_run_parameters(tmp_path, monkeypatch):
    """TensorBoard, W&B (offline, no network) and MLflow (a file store in the run directory) each hold every
    step's off-policy scalars and the config, the plan and the proven staleness bound, read back with their
    own readers."""
    omnigraph_run(tmp_path, SYNTH, "nodes.generate.cost=0", "schedule.iterations=6", ALL, "--executor", "local",
                  "--run-dir", str(tmp_path / "runs"))
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    plan = (run_dir / "plan.txt").read_text()
    stale = series(rows, "staleness_max")
    assert len(stale) == 6 and all(("staleness_mean" in r and "dropped_groups" in r and "regenerated_groups" in r
                                    and "dropped" in r and "regenerated" in r) for r in rows if "staleness_max" in r)

    # TensorBoard
    assert scalars(run_dir, "staleness_max") == stale
    assert [s for s, _ in scalars(run_dir, "dropped_groups")] == [s for s, _ in stale]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    text = acc.Tensors("plan/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "staleness bound: 1 (" in text

    # W&B, offline
    ids, config, history = wandb_read(run_dir)
    assert ids == {json.loads((run_dir / "loggers.json").read_text())["wandb"]["run_id"]}
    assert config["staleness_bound"] == 1 and config["name"] == "synthetic-one-step-off"
    assert config["schedule"]["max_staleness"] == 1 and config["plan"] == plan.rstrip("\n")
    assert [(h["_step"], h["staleness_max"]) for h in history if "staleness_max" in h] == stale
    assert [h["_step"] for h in history if "step_s" in h] == [r["step"] for r in rows]

    # MLflow, a file store in the run directory
    client, run_id = mlflow_client(run_dir, monkeypatch)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert run.data.params["staleness_bound"] == "1" and run.data.params["model.dtype"] == "auto"
    assert run.data.params["schedule.mode"] == "one_step_off"
    got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "staleness_max"))
    assert got == [(s, float(v)) for s, v in stale]
    assert client.get_experiment(run.info.experiment_id).name == "synthetic-one-step-off"
    local = client.download_artifacts(run_id, "plan.txt", str(tmp_path))
    assert Path(local).read_text() == plan


@pytest.mark.parametrize("how", ["resume", "restart"])
def test_a_resumed_run_continues_the_same_runs_with_each_step_once(tmp_path, monkeypatch, how):
    """Stopped at step 7 after the step-3 checkpoint, then continued (``--resume`` in a new process, or a
    supervised restart in the same one): one W&B run id and one MLflow run, every step logged once."""
    env = clean_env(tmp_path)
    env["OMNIGRAPH_INJECT"] = "update@7:raise"
    args = [SYNTH, "nodes.generate.cost=0", "schedule.iterations=10", "checkpoint.every=4",
            "runtime.loggers=[wandb, mlflow]", f"runtime.max_restarts={int(how == 'restart')}",
            "--executor", "local", "--run-dir", str(tmp_path / "runs")]
    omnigraph_run(tmp_path, *args, env=env, want_rc=0 if how == "restart" else 1)
    (run_dir,) = (tmp_path / "runs").iterdir()
    first = json.loads((run_dir / "loggers.json").read_text())
    if how == "resume":
        assert first["mlflow"]["last_step"] == first["wandb"]["last_step"] == 6
        omnigraph_run(tmp_path, "--resume", str(run_dir))
    kept = json.loads((run_dir / "loggers.json").read_text())
    assert {k: v["run_id"] for k, v in kept.items()} == {k: v["run_id"] for k, v in first.items()}
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(11))

    client, run_id = mlflow_client(run_dir, monkeypatch)
    run = client.get_run(run_id)
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run_id]
    assert sorted(m.step for m in client.get_metric_history(run_id, "step_s")) == steps
    assert run.info.status == "FINISHED" and run.data.params["staleness_bound"] == "1"

    ids, _, history = wandb_read(run_dir)
    assert ids == {kept["wandb"]["run_id"]}
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 2     # one per life of the run
    assert sorted(h["_step"] for h in history if "step_s" in h) == steps


class TestTheLoggerInterface:
    @pytest.mark.parametrize("cls", ["TensorBoard", "WandB", "MLflow"])
    def test_a_missing_package_is_named_before_the_run(self, monkeypatch, cls):
        from omnigraph.runtime import loggers
        name = {"TensorBoard": "tensorboard", "WandB": "wandb", "MLflow": "mlflow"}[cls]
        monkeypatch.setattr(getattr(loggers, cls), "missing", staticmethod(lambda: "no_such_package_for_omnigraph"))
        with pytest.raises(GraphError) as e:
            og_compile(SYNTH, overrides=[f"runtime.loggers=[{name}]"])
        assert e.value.where == "runtime.loggers" and f"logger '{name}' needs the no_such_package" in str(e.value)

    def test_a_logger_without_params_still_works(self, tmp_path, monkeypatch):
        """A plugin's logger written as ``Cls(run_dir, start_step)`` with log/flush/close, no ``params``."""
        from omnigraph.runtime import loggers
        got = []

        class Old:
            def __init__(self, run_dir, start_step):
                got.append(("init", start_step))

            def log(self, row):
                got.append(("log", row["step"]))

            def flush(self):
                pass

            def close(self):
                got.append(("close",))

        monkeypatch.setattr(loggers.plugins, "load", lambda group, name, where=None: Old)
        (lg,) = loggers.make(["old"], tmp_path, 3, {"config": {}, "plan": "", "staleness_bound": 1})
        lg.log({"step": 3, "x": 1.0})
        lg.close()
        assert got == [("init", 3), ("log", 3), ("close",)]

    def test_a_logger_that_cannot_start_is_one_message(self, tmp_path, monkeypatch, capsys):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
        assert main(["run", SYNTH, "schedule.iterations=2", "nodes.generate.cost=0", "runtime.loggers=[mlflow]",
                     "--executor", "local", "--run-dir", str(tmp_path), "--quiet"]) == 1
        err = capsys.readouterr().err
        assert "runtime.loggers: logger 'mlflow' failed to start" in err and "Traceback" not in err

    def test_run_parameters_name_the_config_the_plan_and_the_bound(self, tmp_path):
        from omnigraph.runtime.loggers import flat, run_params
        plan = og_compile(SYNTH)
        p = run_params(plan, tmp_path)
        assert p["staleness_bound"] == plan.bound == 1 and p["plan"] == str(plan)
        assert flat(p["config"])["schedule.mode"] == "one_step_off" and p["run_dir"] == str(tmp_path)
