"""plot_run: the PNGs of a finished run, from a small fake run directory."""

from __future__ import annotations

import json
from pathlib import Path

from omnigraph.viz.plots import plot_run

PNG = b"\x89PNG\r\n\x1a\n"
NODES = {"generate": ("rollout/0", 0.05), "reward": ("rollout/0", 0.003),
         "old_logprob": ("trainer/0", 0.02), "update": ("trainer/0", 0.13), "sync": ("trainer/0", 0.001)}


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _config(run: Path, name: str, mode: str) -> None:
    (run / "config.yaml").write_text(f"name: {name}\nschedule:\n  mode: {mode}\n  max_staleness: 1\n")


def _metrics(n: int, reward: bool) -> list[dict]:
    rows = []
    for s in range(n):
        fired = ["generate", "reward"] if s == 0 else list(NODES)
        r = {"step": s, "wall_s": 1.0 + 0.25 * s, "step_s": 0.24 + 0.01 * (s % 3), "fired": fired,
             "timing_s/gen": 0.0 if s else 0.15, "timing_s/update_weights": 0.002,
             "bubble/rollout": 0.4, "bubble/trainer": 0.1}
        r.update({f"timing_s/{k}": NODES[k][1] for k in fired})
        if s:
            r["staleness_max"] = 1
        if reward:
            r.update(reward_mean=0.1 + 0.02 * s, reward_std=0.3)
            if s % 5 == 0:
                r["eval_reward"] = 0.2 + 0.03 * s
        rows.append(r)
    return rows


def _timeline(n: int) -> list[dict]:
    """One-step-off: generate/reward of step s overlap old_logprob/update/sync of step s-1."""
    out, t = [], 100.0
    for s in range(n):
        dur = 2.0 if s == 0 else 0.25  # step 0 carries the warm-up
        for lane in ("rollout/0", "trainer/0"):
            at = t
            for node, (actor, cost) in NODES.items():
                if actor == lane and (s > 0 or lane == "rollout/0"):
                    out.append({"node": node, "actor": actor, "step": s, "t_start": at, "t_end": at + cost})
                    at += cost
        t += dur
    return out


def _check_pngs(paths: list[Path], names: set[str]) -> None:
    assert {p.name for p in paths} == names
    for p in paths:
        assert p.is_file() and p.read_bytes()[:8] == PNG


def test_plot_run_writes_three_pngs(tmp_path: Path) -> None:
    _config(tmp_path, "fake-run", "one_step_off")
    _jsonl(tmp_path / "metrics.jsonl", _metrics(20, reward=True))
    _jsonl(tmp_path / "timeline.jsonl", _timeline(20))
    paths = plot_run(tmp_path)
    _check_pngs(paths, {"reward.png", "timing.png", "timeline.png"})
    assert all(p.parent == tmp_path for p in paths)


def test_no_reward_keys_still_gives_timing(tmp_path: Path) -> None:
    _config(tmp_path, "synthetic", "sync")
    _jsonl(tmp_path / "metrics.jsonl", _metrics(20, reward=False))
    paths = plot_run(str(tmp_path))
    _check_pngs(paths, {"timing.png"})
    assert not (tmp_path / "reward.png").exists() and not (tmp_path / "timeline.png").exists()


def test_sparse_and_broken_inputs(tmp_path: Path) -> None:
    """No config.yaml, a broken line, a null value, a short timeline: no crash."""
    rows = _metrics(3, reward=True)
    rows[1]["reward_mean"] = None
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n\n")
    _jsonl(tmp_path / "timeline.jsonl", _timeline(2))
    _check_pngs(plot_run(tmp_path), {"reward.png", "timing.png", "timeline.png"})


def test_empty_run_dir(tmp_path: Path) -> None:
    assert plot_run(tmp_path) == []
