"""Where a run's metrics go besides ``metrics.jsonl``: ``runtime.loggers: [tensorboard, wandb, mlflow]``.

Every logger gets every numeric field of every step's metrics row as a scalar at that step
(``reward_mean``, ``timing_s/update``, ``bubble/rollout``, and the off-policy figures ``staleness_mean``,
``staleness_max``, ``dropped``/``regenerated`` samples, ``dropped_groups``/``regenerated_groups``), and,
once before the first step, the run's parameters: the resolved config (the graph with every default),
the plan (``plan.txt``) and the proven staleness bound.

- ``tensorboard``: ``<run dir>/tensorboard`` (``tensorboard --logdir runs``): scalars; the config and the
  plan as text, the flattened config and ``staleness_bound`` as hparams.
- ``wandb``: a W&B run in ``<run dir>/wandb``, offline unless ``WANDB_MODE`` says otherwise or an API key
  is set (``WANDB_API_KEY``, or ``wandb login``); upload it later with ``wandb sync
  <run dir>/wandb/offline-run-*``. Config: the graph, ``staleness_bound`` and ``plan``. ``WANDB_PROJECT``
  (default ``omnigraph``) and ``WANDB_ENTITY`` are honoured.
- ``mlflow``: an MLflow run in the file store ``<run dir>/mlruns`` (``mlflow ui --backend-store-uri
  <run dir>/mlruns``; MLflow 3 wants ``MLFLOW_ALLOW_FILE_STORE=true`` for it, set for this process), or
  where ``MLFLOW_TRACKING_URI`` points. Experiment ``MLFLOW_EXPERIMENT_NAME``, default the graph's name.
  Params: the config flattened (``model.dtype``) and ``staleness_bound``; artifacts ``config.yaml`` and
  ``plan.txt``.

A resumed run (``--resume``, or a restart after a failure) shows each step once: TensorBoard purges what
the old run wrote after its checkpoint; W&B and MLflow continue the same run (its id is kept in
``<run dir>/loggers.json`` with the last step logged) and skip the steps it had already logged.

A logger is a class registered under the entry-point group ``omnigraph.loggers``::

    class MyLogger:
        @staticmethod
        def missing() -> str | None: ...          # a package it needs that is not installed (validation
                                                  # reports it before the run), else None
        class Options(omnigraph.sdk.Options): ...   # optional: what runtime.logger_options.<name> may set
        def __init__(self, run_dir: Path, start_step: int, **options): ...   # start_step > 0: resuming
        def params(self, params: dict) -> None: ...  # optional, once before the first step
        def log(self, row: dict) -> None: ...      # each step's metrics row (``row["step"]``)
        def flush(self) -> None: ...               # after each step
        def close(self) -> None: ...

``params`` is optional: a logger written before it existed still works. It gets ``config`` (the spec as a
nested dict, what ``config.yaml`` holds), ``plan`` (the text of ``plan.txt``), ``staleness_bound`` (the
compiler's proven bound) and ``run_dir``.
"""

from __future__ import annotations

import importlib.util
import json
import netrc
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from .. import plugins
from ..errors import GraphError
from ..sdk import Options


def run_params(plan, run_dir: Path) -> dict[str, Any]:
    """What ``params`` gets: the config, the plan's text, the proven staleness bound, the run directory."""
    return {"config": plan.graph.spec.model_dump(mode="json"), "plan": str(plan), "staleness_bound": plan.bound,
            "run_dir": str(run_dir)}


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a metrics row (``step`` aside)."""
    return {k: v for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"dtype": "auto"}}`` -> ``{"model.dtype": "auto"}``; lists stay lists."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _kept(run_dir: Path, name: str) -> dict[str, Any]:
    """What logger ``name`` kept in ``<run dir>/loggers.json`` (its run id, the last step logged)."""
    path = Path(run_dir) / "loggers.json"
    return json.loads(path.read_text()).get(name, {}) if path.exists() else {}


def _keep(run_dir: Path, name: str, **values: Any) -> None:
    path = Path(run_dir) / "loggers.json"
    every = json.loads(path.read_text()) if path.exists() else {}
    every.setdefault(name, {}).update(values)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(every, indent=1) + "\n")
    os.replace(tmp, path)


class TensorBoard:
    """``tensorboard``: scalars, the config and the plan as text, hparams."""

    @staticmethod
    def missing() -> str | None:
        return "tensorboard" if importlib.util.find_spec("tensorboard") is None else None

    class Options(Options):
        """``tensorboard`` takes no options (its files go to ``<run dir>/tensorboard``)."""

    def __init__(self, run_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter
        self.dir = Path(run_dir) / "tensorboard"
        self.start = start_step
        self.writer = SummaryWriter(str(self.dir), purge_step=start_step or None)

    def params(self, params: dict[str, Any]) -> None:
        if self.start:                      # written by the run this one resumes
            return
        from torch.utils.tensorboard.summary import hparams
        config = yaml.safe_dump(params["config"], sort_keys=False)
        self.writer.add_text("config", _code(config), 0)
        self.writer.add_text("plan", _code(params["plan"]), 0)
        hp = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v)
              for k, v in flat(params["config"]).items() if v is not None}
        hp["staleness_bound"] = params["staleness_bound"]
        for summary in hparams(hp, {}):
            self.writer.file_writer.add_summary(summary)

    def log(self, row: dict[str, Any]) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, row["step"])

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _code(text: str) -> str:
    """Text shown as written (TensorBoard renders markdown)."""
    return "\n".join("    " + line for line in text.splitlines())


class WandB:
    """``wandb``: a W&B run in ``<run dir>/wandb``, offline unless configured otherwise."""

    @staticmethod
    def missing() -> str | None:
        return "wandb" if importlib.util.find_spec("wandb") is None else None

    class Options(Options):
        """``runtime.logger_options.wandb``."""

        project: str | None = None
        """The W&B project (default: ``$WANDB_PROJECT``, else ``omnigraph``)."""
        entity: str | None = None
        """The W&B entity (team or user; default: the account's)."""
        tags: list[str] = []
        """Tags of the run."""

    def __init__(self, run_dir: Path, start_step: int, project: str | None = None, entity: str | None = None,
                 tags: list[str] | None = None):
        import wandb
        self.run_dir = Path(run_dir)
        kept = _kept(self.run_dir, "wandb")
        self.last = kept.get("last_step", -1)
        mode = None if os.environ.get("WANDB_MODE") else ("online" if _wandb_key() else "offline")
        silent = os.environ.get("WANDB_SILENT", "true").lower() in ("1", "true", "yes")
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT") or "omnigraph", entity=entity,
                              tags=list(tags or []) or None, name=self.run_dir.name,
                              dir=str(self.run_dir), id=kept.get("run_id"), resume="allow", mode=mode,
                              settings=wandb.Settings(silent=silent, console="off"))
        _keep(self.run_dir, "wandb", run_id=self.run.id, last_step=self.last)

    def params(self, params: dict[str, Any]) -> None:
        self.run.config.update({**params["config"], "staleness_bound": params["staleness_bound"],
                                "plan": params["plan"]}, allow_val_change=True)

    def log(self, row: dict[str, Any]) -> None:
        if row["step"] <= self.last:        # logged before the run was resumed
            return
        self.run.log(scalars(row), step=row["step"])
        self.last = row["step"]

    def flush(self) -> None:
        _keep(self.run_dir, "wandb", last_step=self.last)

    def close(self) -> None:
        self.flush()
        self.run.finish()


def _wandb_key() -> bool:
    """An API key for W&B is configured: ``WANDB_API_KEY``, or ``wandb login``'s entry in ``~/.netrc``."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


MLFLOW_PARAM_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")
"""What MLflow allows in a param's name (anything else becomes ``_``)."""


class MLflow:
    """``mlflow``: an MLflow run in ``<run dir>/mlruns`` (a file store), or at ``MLFLOW_TRACKING_URI``."""

    @staticmethod
    def missing() -> str | None:
        return "mlflow-skinny" if importlib.util.find_spec("mlflow") is None else None

    class Options(Options):
        """``runtime.logger_options.mlflow``."""

        tracking_uri: str | None = None
        """Where runs go (default: ``$MLFLOW_TRACKING_URI``, else a file store in the run directory)."""
        experiment: str | None = None
        """The experiment's name (default: ``$MLFLOW_EXPERIMENT_NAME``, else the graph's name)."""

    def __init__(self, run_dir: Path, start_step: int, tracking_uri: str | None = None,
                 experiment: str | None = None):
        from mlflow.tracking import MlflowClient
        self.run_dir = Path(run_dir)
        self.experiment = experiment
        kept = _kept(self.run_dir, "mlflow")
        self.last = kept.get("last_step", -1)
        self.uri = (kept.get("tracking_uri") or tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                    or (self.run_dir / "mlruns").resolve().as_uri())
        if self.uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3 refuses a file store without it
        self.client = MlflowClient(self.uri)
        self.run_id = kept.get("run_id")
        if self.run_id:
            self.client.update_run(self.run_id, status="RUNNING")

    def _start(self, name: str) -> str:
        if self.run_id is None:
            exp_name = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or name
            exp = self.client.get_experiment_by_name(exp_name)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(exp_name)
            self.run_id = self.client.create_run(exp_id, run_name=self.run_dir.name,
                                                 tags={"omnigraph.run_dir": str(self.run_dir)}).info.run_id
            _keep(self.run_dir, "mlflow", run_id=self.run_id, tracking_uri=self.uri, last_step=self.last)
        return self.run_id

    def params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH
        run_id = self._start(params["config"].get("name") or "omnigraph")
        values = {**flat(params["config"]), "staleness_bound": params["staleness_bound"]}
        have = self.client.get_run(run_id).data.params      # a resumed run keeps what it logged
        todo = [Param(MLFLOW_PARAM_CHARS.sub("_", k), (v if isinstance(v, str) else json.dumps(v))
                      [:MAX_PARAM_VAL_LENGTH]) for k, v in values.items()]
        todo = [p for p in todo if p.key not in have]
        for i in range(0, len(todo), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=todo[i:i + MAX_PARAMS_TAGS_PER_BATCH])
        self.client.log_text(run_id, yaml.safe_dump(params["config"], sort_keys=False), "config.yaml")
        self.client.log_text(run_id, params["plan"] + "\n", "plan.txt")

    def log(self, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric
        if row["step"] <= self.last:        # logged before the run was resumed
            return
        run_id = self._start("omnigraph")
        now = _millis()
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, row["step"])
                                               for k, v in scalars(row).items()])
        self.last = row["step"]

    def flush(self) -> None:
        if self.run_id is not None:
            _keep(self.run_dir, "mlflow", last_step=self.last)

    def close(self) -> None:
        if self.run_id is not None:
            self.flush()
            self.client.set_terminated(self.run_id)


def _millis() -> int:
    return int(time.time() * 1000)


def options(cls, name: str, raw: dict | None) -> tuple[dict[str, Any], list[GraphError]]:
    """``runtime.logger_options.<name>`` validated against the logger's options (keyword arguments)."""
    opts, errors = plugins.typed_options(cls, raw, f"runtime.logger_options.{name}", kind=f"logger {name}",
                                         call=cls, passed=frozenset({"run_dir", "start_step"}))
    if errors:
        return {}, errors
    return ({k: getattr(opts, k) for k in type(opts).model_fields} if hasattr(type(opts), "model_fields")
            else dict(opts or {})), []


def make(names: list[str], run_dir: Path, start_step: int, params: dict[str, Any] | None = None,
         settings: dict[str, dict] | None = None) -> list:
    """The loggers ``runtime.loggers`` names (with their ``runtime.logger_options``), each given ``params`` (if
    it takes them) before the first step. One that fails to start is a GraphError naming it; the ones already
    started are closed."""
    out: list = []
    for name in dict.fromkeys(names):
        cls = plugins.load("loggers", name, where="runtime.loggers")
        kwargs, errors = options(cls, name, (settings or {}).get(name))
        if errors:
            raise errors[0]
        try:
            lg = cls(run_dir, start_step, **kwargs)
            out.append(lg)
            if params is not None and hasattr(lg, "params"):
                lg.params(params)
        except Exception as e:  # noqa: BLE001 - a logger's own error, said in one line
            for lg in out:
                try:
                    lg.close()
                except Exception:  # noqa: BLE001 - already reporting the first error
                    pass
            raise GraphError(f"logger '{name}' failed to start: {type(e).__name__}: {e}", where="runtime.loggers",
                             fix=f"check its settings (for wandb: WANDB_MODE, WANDB_API_KEY; for mlflow: "
                                 f"MLFLOW_TRACKING_URI), or remove {name} from runtime.loggers") from None
    return out
