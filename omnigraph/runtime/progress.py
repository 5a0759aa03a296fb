"""The live progress line: step, reward, staleness and s/step (silent when disabled)."""

from __future__ import annotations

from typing import Any

from rich import progress as rp


class Progress:
    """A rich progress bar with step, reward, staleness and s/step (silent when disabled)."""

    def __init__(self, plan, enabled: bool, console=None):
        self.enabled = enabled
        self.total = plan.steps
        if not enabled:
            return
        self.progress = rp.Progress(rp.TextColumn("[bold]{task.description}"), rp.BarColumn(),
                                    rp.MofNCompleteColumn(), rp.TimeElapsedColumn(),
                                    rp.TextColumn("{task.fields[info]}"), console=console, transient=False)
        self.task = self.progress.add_task(plan.name, total=self.total, info="")

    def __enter__(self):
        if self.enabled:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)

    def skip(self, steps: int) -> None:
        if self.enabled:
            self.progress.update(self.task, completed=steps)

    def log(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text)

    def status(self, text: str) -> None:
        if self.enabled:
            self.progress.update(self.task, info=text)

    def advance(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        parts = []
        if "reward_mean" in row:
            parts.append(f"reward {row['reward_mean']:.3f}")
        if "staleness_max" in row:
            parts.append(f"staleness {row['staleness_max']}")
        parts.append(f"{row['step_s']:.3f} s/step")
        self.progress.update(self.task, advance=1, info="  ".join(parts))
