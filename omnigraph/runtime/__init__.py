"""Running a plan: the run directory (:mod:`.rundir`), supervision and restarts (:mod:`.supervisor`),
checkpoints (:mod:`.checkpoint`), the sample ledger (:mod:`.ledger`), per-step metrics (:mod:`.metrics`),
loggers (:mod:`.loggers`) and the progress line (:mod:`.progress`)."""

from .supervisor import RunResult, run

__all__ = ["RunResult", "run"]
