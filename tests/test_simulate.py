"""``omnigraph plan --simulate``: the layout advisor on paper at 8 to 1,024 devices, from fitted node times and a
link model (what ranks the layouts is the inputs: the tests feed each shape and read the ranking)."""

from __future__ import annotations

import json

import pytest

from omnigraph.cli import main

from test_layouts import GRAPH, colocated, separate

GEN_BOUND = ({"generate": 99.5, "reward": 0.5, "old_logprob": 10.0, "update": 48.0, "sync": 2.0},
             {"generate": 89.5, "reward": 0.5, "old_logprob": 5.0, "update": 24.0, "sync": 1.0})


def simulate(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["plan", GRAPH, *args, "--simulate", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def generation_bound(tmp_path) -> list[str]:
    """A long-tail generation: 99.5 s on 1 device, 89.5 on 2 (a fixed part of 79.5 s more devices do not
    shorten); training halves with the devices."""
    return ["--timings", separate(tmp_path / "gen11", 1, 2, GEN_BOUND[0]),
            "--timings", colocated(tmp_path / "gen2", 2, GEN_BOUND[1])]


def test_minicpm_o_shape_ranks_colocated_then_3_plus_1_then_2_plus_2(tmp_path, capsys):
    """verl-omni's trainer-bound MiniCPM-o runs on 4 devices: colocated 4+0 181.5 s/step, separate 3+1 192.2,
    2+2 about 273. Fed the 3+1 run's node times, the simulator ranks them so: training (192 s on 1 device) is
    most of the work, and only the colocated pool trains on all 4."""
    run = separate(tmp_path / "r31", 3, 4, {"generate": 177.5, "reward": 0.5, "old_logprob": 40.0,
                                            "update": 150.0, "sync": 2.2})
    report = simulate(capsys, "--timings", run, "--sizes", "4")
    (size,) = report["sizes"]
    best = {}
    for r in size["layouts"]:
        best[r["layout"]] = min(best.get(r["layout"], float("inf")), r["predicted_s"])
    assert best["colocated 4"] < best["separate 3+1"] < best["separate 2+2"], best
    assert best["separate 3+1"] == pytest.approx(192.2, rel=0.01) and best["colocated 4"] == pytest.approx(181.5, rel=0.01)
    assert size["recommended"]["layout"] == "colocated 4"


def test_every_size_from_8_to_1024_gets_a_layout_and_where_its_time_goes(tmp_path, capsys):
    report = simulate(capsys, *generation_bound(tmp_path))
    assert [s["devices"] for s in report["sizes"]] == [8, 16, 32, 64, 128, 256, 512, 1024]
    for s in report["sizes"]:
        rec = s["recommended"]
        assert rec and rec["staleness_bound"] <= 1 and s["busy"] and max(s["busy"].values()) == pytest.approx(1, abs=1e-3)
        assert len(s["layouts"]) >= 3 * 4          # colocated and several splits, each under three schedules
    capsys.readouterr()
    assert main(["plan", GRAPH, *generation_bound(tmp_path / "again"), "--simulate", "--sizes", "8"]) == 0
    out = capsys.readouterr().out
    assert "separate 7+1" in out and "weights 0.001 s on the link a sync" in out, out


def test_a_slow_link_takes_the_separate_pool_back_and_delta_sync_returns_it(tmp_path, capsys):
    runs = generation_bound(tmp_path)
    fast = simulate(capsys, *runs, "--sizes", "8")["sizes"][0]["recommended"]
    slow = simulate(capsys, *runs, "--sizes", "8", "--weights-gb", "100", "--link", "0.01,5")
    few = simulate(capsys, *runs, "--sizes", "8", "--weights-gb", "100", "--link", "0.01,5", "--delta", "0.001")
    assert fast["layout"] == "separate 7+1" and fast["schedule"] == "one_step_off"
    assert slow["link_s"] == pytest.approx(10000.005) and slow["sizes"][0]["recommended"]["layout"] == "colocated 8"
    assert few["link_s"] == pytest.approx(10.005) and few["sizes"][0]["recommended"]["layout"] == "separate 7+1"


@pytest.mark.parametrize("args, where", [(["--link", "fast"], "--link"), (["--delta", "0"], "--delta"),
                                         (["--sizes", "8,x"], "--sizes"), (["--devices", "4"], "--simulate")])
def test_bad_options_are_one_message(tmp_path, capsys, args, where):
    assert main(["plan", GRAPH, *generation_bound(tmp_path), "--simulate", *args]) == 1
    err = capsys.readouterr().err
    assert where in err and "Traceback" not in err, err
