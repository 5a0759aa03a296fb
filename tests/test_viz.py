"""The visualisers: golden text pictures, coverage of every node and edge, PNG files."""

import pytest

import omnigraph as og
from omnigraph.testing import canonical_spec
from omnigraph.viz import FORMATS, render, timeline
from omnigraph.viz.png import graph_png
from omnigraph.viz.text import to_ascii, to_dot, to_mermaid
from omnigraph.viz.gantt import box_labels, timeline_png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

MERMAID = """\
flowchart LR
    %% canonical-one_step_off: mode one_step_off, staleness bound 1
    subgraph pool_rollout["rollout: 1 actor, cpus 1, gpus 0"]
        generate["generate<br/>generate"]
        reward["reward<br/>reward"]
    end
    subgraph pool_trainer["trainer: 1 actor, cpus 1, gpus 0"]
        old_logprob["old_logprob<br/>old_logprob"]
        update["update<br/>update"]
        sync["sync<br/>sync"]
    end
    generate -->|"Rollout"| reward
    reward -.->|"Batch, delay 1"| old_logprob
    old_logprob -->|"Batch"| update
    update -->|"Weights"| sync
    sync -.->|"Weights, delay 1"| generate
"""

DOT = """\
digraph "canonical-one_step_off" {
    rankdir=LR;
    labelloc=t;
    label="canonical-one_step_off: mode one_step_off, staleness bound 1";
    node [shape=box, style="rounded,filled", fillcolor=white];
    subgraph "cluster_rollout" {
        label="rollout: 1 actor, cpus 1, gpus 0";
        "generate" [label="generate\\ngenerate"];
        "reward" [label="reward\\nreward"];
    }
    subgraph "cluster_trainer" {
        label="trainer: 1 actor, cpus 1, gpus 0";
        "old_logprob" [label="old_logprob\\nold_logprob"];
        "update" [label="update\\nupdate"];
        "sync" [label="sync\\nsync"];
    }
    "generate" -> "reward" [label="Rollout"];
    "reward" -> "old_logprob" [label="Batch\\ndelay 1", style=dashed];
    "old_logprob" -> "update" [label="Batch"];
    "update" -> "sync" [label="Weights"];
    "sync" -> "generate" [label="Weights\\ndelay 1", style=dashed, constraint=false];
}
"""

ASCII = """\
graph canonical-one_step_off (mode one_step_off)

pool rollout (1 actor, cpus 1, gpus 0)
  [generate]     generate
  [reward]       reward
pool trainer (1 actor, cpus 1, gpus 0)
  [old_logprob]  old_logprob
  [update]       update
  [sync]         sync

edges
  generate --> reward                Rollout
  reward ==[delay 1]==> old_logprob  Batch
  old_logprob --> update             Batch
  update --> sync                    Weights
  sync ==[delay 1]==> generate       Weights

staleness bound: 1 (max_staleness 1000; reward -> old_logprob delay 1; sync -> generate delay 1)
"""

CASES = {
    "sync": dict(mode="sync"),
    "one_step_off": dict(mode="one_step_off"),
    "async_ahead_2": dict(mode="async", ahead=2),
    "sync_every_4": dict(mode="one_step_off", sync_every=4),
    "colocated": dict(mode="one_step_off", colocate=True),
}


def plan_of(case: str):
    kw = dict(CASES[case])
    return og.compile(canonical_spec(kw.pop("mode"), cost=0.1, iterations=20, **kw))


@pytest.fixture(scope="module")
def one_step_off():
    return plan_of("one_step_off")


class TestGoldenText:
    def test_mermaid_of_one_step_off_is_pinned(self, one_step_off):
        assert to_mermaid(one_step_off) == MERMAID

    def test_dot_of_one_step_off_is_pinned(self, one_step_off):
        assert to_dot(one_step_off) == DOT

    def test_ascii_of_one_step_off_is_pinned(self, one_step_off):
        assert to_ascii(one_step_off) == ASCII

    def test_render_dispatches_to_the_text_renderers(self, one_step_off):
        assert render(one_step_off, "mermaid") == MERMAID
        assert render(one_step_off, "dot") == DOT
        assert render(one_step_off, "ascii") == ASCII


class TestEveryNodeAndEdgeIsDrawn:
    @pytest.mark.parametrize("case", CASES)
    def test_mermaid_has_every_node_and_edge(self, case):
        plan = plan_of(case)
        text = to_mermaid(plan)
        for n in plan.graph.nodes.values():
            assert f'{n.name}["{n.name}<br/>{n.kind}' in text
        for e in plan.graph.edges:
            arrow = "-.->" if e.delay else "-->"
            delay = f", delay {e.delay}" if e.delay else ""
            assert f'{e.src} {arrow}|"{e.type}{delay}"| {e.dst}' in text

    @pytest.mark.parametrize("case", CASES)
    def test_dot_has_every_node_and_edge(self, case):
        plan = plan_of(case)
        text = to_dot(plan)
        for n in plan.graph.nodes.values():
            assert f'"{n.name}" [label="{n.name}\\n{n.kind}' in text
        for e in plan.graph.edges:
            line = next(x for x in text.splitlines() if x.strip().startswith(f'"{e.src}" -> "{e.dst}"'))
            assert ("style=dashed" in line) == (e.delay > 0)
            assert (f"delay {e.delay}" in line) == (e.delay > 0)

    @pytest.mark.parametrize("case", CASES)
    def test_ascii_has_every_node_and_edge(self, case):
        plan = plan_of(case)
        text = to_ascii(plan)
        for n in plan.graph.nodes.values():
            assert f"[{n.name}]" in text
        for e in plan.graph.edges:
            arrow = f"==[delay {e.delay}]==>" if e.delay else "-->"
            assert f"  {e.src} {arrow} {e.dst} " in text
        assert f"staleness bound: {plan.bound} (" in text

    def test_a_node_named_like_a_mermaid_keyword_gets_a_safe_id(self):
        spec = canonical_spec("one_step_off").model_dump()
        spec["nodes"]["end"] = spec["nodes"].pop("sync")
        spec["edges"] = ["generate -> reward", "reward -> old_logprob", "old_logprob -> update",
                         "update -> end", "end -> generate"]
        text = to_mermaid(og.compile(og.GraphSpec.model_validate(spec)))
        assert 'n_end["end<br/>sync"]' in text
        assert "update -->|\"Weights\"| n_end" in text and "n_end -.->" in text


class TestRender:
    def test_text_is_also_written_to_out(self, one_step_off, tmp_path):
        out = tmp_path / "g.mmd"
        assert render(one_step_off, "mermaid", out=str(out)) == MERMAID
        assert out.read_text() == MERMAID

    def test_png_is_written_to_out_and_returns_none(self, one_step_off, tmp_path):
        out = tmp_path / "g.png"
        assert render(one_step_off, "png", out=str(out)) is None
        assert out.read_bytes()[:8] == PNG_MAGIC

    def test_png_without_a_file_is_rejected(self, one_step_off):
        with pytest.raises(og.GraphError, match="png format needs a file"):
            render(one_step_off, "png")

    def test_unknown_format_is_rejected_with_the_choices(self, one_step_off):
        with pytest.raises(og.GraphError, match="unknown format 'svg'.*mermaid, dot, ascii, png"):
            render(one_step_off, "svg")

    def test_formats_are_the_documented_four(self):
        assert FORMATS == ("mermaid", "dot", "ascii", "png")


class TestTimelineLabels:
    def test_generate_box_names_the_batch_and_the_weights_version_it_used(self, one_step_off):
        gen = [b for b in one_step_off.prediction.boxes if b.node == "generate" and b.op == "run"]
        assert [box_labels(one_step_off, b)[0] for b in gen[:4]] == \
            ["gen b0 v0", "gen b1 v0", "gen b2 v1", "gen b3 v2"]

    def test_update_box_names_the_batch_it_trains_and_the_trainer_version(self, one_step_off):
        upd = [b for b in one_step_off.prediction.boxes if b.node == "update"]
        assert [box_labels(one_step_off, b)[0] for b in upd[:3]] == ["upd b0 v0", "upd b1 v1", "upd b2 v2"]

    def test_one_step_off_rolls_out_batch_i_while_training_batch_i_minus_1(self, one_step_off):
        boxes = [b for b in one_step_off.prediction.boxes if b.op == "run" and b.step == 3]
        upd = next(b for b in boxes if b.node == "update")
        assert box_labels(one_step_off, upd)[0] == "upd b2 v2"
        rollout = [b for b in boxes if b.actor == "rollout.0"]
        trainer = [b for b in boxes if b.actor == "trainer.0"]
        assert min(b.start for b in rollout) < max(b.end for b in trainer)
        assert min(b.start for b in trainer) < max(b.end for b in rollout)


class TestPng:
    @pytest.mark.parametrize("case", CASES)
    def test_graph_png_writes_a_png(self, case, tmp_path):
        out = tmp_path / "graph.png"
        graph_png(plan_of(case), str(out))
        data = out.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5_000

    @pytest.mark.parametrize("case", CASES)
    def test_timeline_png_writes_a_png(self, case, tmp_path):
        out = tmp_path / "timeline.png"
        timeline_png(plan_of(case), str(out))
        data = out.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5_000

    def test_timeline_entry_point_writes_a_png(self, one_step_off, tmp_path):
        out = tmp_path / "t.png"
        timeline(one_step_off, str(out))
        assert out.read_bytes()[:8] == PNG_MAGIC
