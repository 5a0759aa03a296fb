"""Prompts from data (``task.source``): files through Hugging Face ``datasets``, reasoning-gym, the verifiers;
the data order as a function of the step, the ledger by row, and resuming on the same data only."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import omnigraph as og
from omnigraph import plugins
from omnigraph.errors import NodeFailure
from omnigraph.runtime import run
from omnigraph.runtime.ledger import read
from omnigraph.runtime.rundir import check_data, write_header

from conftest import GRAPHS, ROOT

DATA_GRAPH = GRAPHS / "grpo_dataset.yaml"
RG_GRAPH = GRAPHS / "smollm2_reasoning_gym.yaml"
ROWS = [{"id": f"r{i}", "question": f"copy {1000 + i}:", "answer": str(1000 + i), "n": i} for i in range(40)]
USER = [{"id": f"q-{i}", "q": f"copy {2000 + i}:", "a": str(2000 + i), "meta": {"level": i % 3}} for i in range(40)]
"""A user's own rows: their fields are ``id``, ``q``, ``a`` and ``meta``."""
USER_FIELDS = {"prompt": "q", "answer": "a", "split": "train", "eval_split": "null", "epochs": "null",
               "max_prompt_tokens": "null"}


def task(*overrides, **fields):
    """The task of the dataset graph with ``fields`` as ``task.*`` overrides (values as YAML), after ``overrides``."""
    spec = og.load(DATA_GRAPH, [*overrides, *(f"task.{k}={v}" for k, v in fields.items())])
    return plugins.make_task(spec)


def write_jsonl(path: Path, rows=ROWS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def omnigraph(*args, cwd=ROOT):
    exe = Path(sys.executable).parent / "omnigraph"
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


class TestFiles:
    def test_the_shipped_file_is_what_its_script_writes(self):
        sys.path.insert(0, str(ROOT / "scripts"))
        import make_digits_data
        assert (ROOT / "data" / "digits_copy.jsonl").read_text() == make_digits_data.text()

    def test_jsonl_csv_parquet_and_a_saved_dataset_give_the_same_prompts(self, tmp_path):
        import datasets
        ds = datasets.Dataset.from_list(ROWS)
        ds.to_csv(str(tmp_path / "rows.csv"))
        ds.to_parquet(str(tmp_path / "rows.parquet"))
        ds.save_to_disk(str(tmp_path / "saved"))
        common = {"prompt": "question", "max_prompt_tokens": "null", "epochs": "null", "split": "train",
                  "eval_split": "null"}
        want = [(p.text, p.meta["target"], p.meta["row"]) for p in
                task(source=write_jsonl(tmp_path / "rows.jsonl"), **common).batch(1)]
        for source in ("rows.csv", "rows.parquet", "saved"):
            got = [(p.text, p.meta["target"], p.meta["row"]) for p in task(source=tmp_path / source, **common).batch(1)]
            assert got == want, source
        assert len(want) == 16 and all(t == f"copy {1000 + r}:" for t, _, r in want)

    def test_splits_slice_and_the_eval_rows_are_not_trained(self):
        t = task()
        assert t.describe()["rows"] == 340 and t.describe()["eval_rows"] == 60
        trained = {p.meta["row"] for s in range(40) for p in t.batch(s)}
        held = {p.meta["row"] for p in t.eval_set()}
        assert trained == set(range(340)) and held <= set(range(340, 400))

    def test_the_data_order_is_a_function_of_the_step_and_reshuffles_every_epoch(self):
        a, b = task(), task()
        assert [p.text for p in a.batch(7)] == [p.text for p in b.batch(7)]
        rows = a.describe()["rows"]
        epoch0 = [a.train[i][0] for i in a.order(0)]
        epoch1 = [a.train[i][0] for i in a.order(1)]
        assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
        assert a.cursor(30) == {"epoch": 30 * 16 // rows, "position": 30 * 16 % rows, "rows": rows}
        assert {p.meta["epoch"] for p in a.batch(30)} == {1}
        assert [p.meta["row"] for p in task(shuffle_seed="null").batch(0)] == list(range(16))

    def test_rows_of_chat_messages_go_through_the_chat_template(self, tmp_path):
        rows = [{"messages": [{"role": "user", "content": f"copy {i}:"}], "answer": str(i)} for i in range(20)]
        # a synthetic generator: no model reads the prompts, so none measures them (the tiny model has no chat
        # template: with it, the default limit refuses chat prompts at once, as its generator would)
        t = task("nodes.generate.backend=synthetic", "nodes.generate.cost=0.01",
                 source=write_jsonl(tmp_path / "chat.jsonl", rows), prompt="messages", max_prompt_tokens="null",
                 epochs="null", eval_split="null", split="train", system="'Be brief.'")
        p = t.batch(0)[0]
        assert p.chat and p.messages[0] == {"role": "system", "content": "Be brief."} and p.text.startswith("copy ")

    def test_long_prompts_are_filtered_and_counted_or_refused(self, tmp_path):
        rows = ROWS + [{"id": "long", "question": "copy " + "9" * 40 + ":", "answer": "9", "n": 99}]
        source = write_jsonl(tmp_path / "long.jsonl", rows)
        t = task(source=source, prompt="question", split="train", eval_split="null", epochs="null")
        assert t.describe()["filtered"] == 1 and t.describe()["split"]["left_out"] == [40]
        with pytest.raises(og.GraphError, match=r"task.max_prompt_tokens: 1 prompt\(s\) of split 'train' are longer "
                                                r"than max_prompt_tokens = 16 \(row 40: 47 tokens\)"):
            og.compile(DATA_GRAPH, overrides=[f"task.source={source}", "task.prompt=question", "task.split=train",
                                              "task.eval_split=null", "task.epochs=null", "task.on_long=error"])


class TestErrors:
    @pytest.mark.parametrize("override, message", [
        ("task.source=data/nope.jsonl", "task.source: no such file or folder 'data/nope.jsonl'"),
        ("task.prompt='{question}'", "task.prompt: the rows have no field 'question' (fields: answer, id, number)"),
        ("task.answer=solution", "task.answer: the rows have no field 'solution'"),
        ("task.split=dev", "task.split: no split 'dev' in"),
        ("task.epochs=1", "task.epochs: 60 iterations need 960 prompts but 1 epoch(s) of 340 rows give 21 steps"),
    ])
    def test_a_data_mistake_is_one_line_naming_the_field(self, override, message):
        p = omnigraph("check", str(DATA_GRAPH), override)
        assert p.returncode == 1 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
        assert message in p.stderr, p.stderr

    def test_data_fields_without_a_source_and_name_with_a_source_are_refused(self):
        with pytest.raises(og.GraphError, match="task.prompt applies to prompts from data only"):
            og.compile(GRAPHS / "grpo_sync.yaml", overrides=["task.prompt=question"])
        with pytest.raises(og.GraphError, match="task.name and task.source are exclusive"):
            og.compile(DATA_GRAPH, overrides=["task.name=arithmetic"])

    def test_a_file_that_is_not_json_lines_is_one_error(self, tmp_path):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"prompt": "a", "answer": "b"}\n{not json\n')
        with pytest.raises(og.GraphError, match="task.source: cannot read"):
            og.compile(DATA_GRAPH, overrides=[f"task.source={bad}"])


def user_overrides(source: Path, **fields) -> list[str]:
    return [f"task.source={source}", *(f"task.{k}={v}" for k, v in {**USER_FIELDS, **fields}.items())]


class TestUserData:
    """A user's own JSONL (``id``, ``q``, ``a``, ``meta``): rows without an answer, a broken line, prompts longer
    than the model reads, the rows' own ids."""

    def test_rows_without_a_prompt_or_answer_are_left_out_and_counted_or_refused(self, tmp_path):
        rows = [dict(r) for r in USER]
        rows[3]["a"] = None                     # null
        del rows[4]["a"]                        # absent
        rows[5]["a"] = "  "                     # blank
        rows[6]["q"] = ""                       # empty prompt
        rows[7]["q"] = None
        source = write_jsonl(tmp_path / "user.jsonl", rows)
        t = task(source=source, **USER_FIELDS)
        d = t.describe()
        assert d["missing"] == 5 and d["rows"] == 35 and d["split"]["left_out"] == [3, 4, 5, 6, 7]
        seen = [p for s in range(5) for p in t.batch(s)]
        assert {p.meta["row"] for p in seen}.isdisjoint({3, 4, 5, 6, 7})
        assert all(p.meta["target"].strip() and p.meta["target"] != "None" for p in seen)
        plan = str(og.compile(DATA_GRAPH, overrides=user_overrides(source)))
        assert "35 rows from" in plan and "(split train, 5 left out (no prompt or answer))" in plan, plan
        with pytest.raises(og.GraphError, match=r"^task.answer: row 3 \(id 'q-3'\) of split 'train' has no answer: "
                                                r"field 'a' is null \(5 row\(s\) of the split have no prompt or answer\)"):
            task(source=source, on_missing="error", **USER_FIELDS)
        chat = [{"messages": [] if i == 2 else [{"role": "user", "content": f"copy {i}:"}], "answer": str(i)}
                for i in range(20)]                                      # an empty list of messages
        t = task("nodes.generate.backend=synthetic", "nodes.generate.cost=0.01", prompt="messages",
                 source=write_jsonl(tmp_path / "chat.jsonl", chat), split="train", eval_split="null", epochs="null",
                 max_prompt_tokens="null")
        assert t.describe()["missing"] == 1 and t.describe()["split"]["left_out"] == [2]

    def test_a_broken_json_line_is_named_by_its_file_line_and_start_in_one_line(self, tmp_path):
        lines = [json.dumps(r) for r in USER]
        lines.insert(5, "")                                             # every line counts, blank ones too
        lines[23] = '{"id": "q-22", "q": "copy 2022:" "a": "2022", "meta": {"note": "' + "x" * 80 + '"}}'
        bad = tmp_path / "user.jsonl"
        bad.write_text("\n".join(lines) + "\n")
        for command in (["check"], ["run", "--run-dir", str(tmp_path / "runs")]):
            p = omnigraph(*command, str(DATA_GRAPH), *user_overrides(bad))
            assert p.returncode == 1 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
            assert (f"task.source: cannot read '{bad}': line 24 is not JSON (Expecting ',' delimiter at column 34): "
                    f"{lines[23][:60]}... (fix: correct or remove line 24") in p.stderr, p.stderr
            assert lines[23][:61] not in p.stderr and "row 22" not in p.stderr
        doc = json.dumps(USER[:3], indent=2).splitlines()               # one JSON document over many lines
        at = doc.index('    "a": "2001",')
        doc[at] = '    "a": 2001x,'
        (tmp_path / "user.json").write_text("\n".join(doc) + "\n")
        with pytest.raises(og.GraphError, match=rf"task.source: cannot read '.*user.json': line {at + 1} is not JSON "
                                                r"\(Expecting ',' delimiter at column 14\):     \"a\": 2001x,"):
            og.compile(DATA_GRAPH, overrides=user_overrides(tmp_path / "user.json"))

    def test_prompts_longer_than_the_models_context_are_left_out_by_default(self, tmp_path, monkeypatch):
        """No ``max_prompt_tokens``: the limit is the model's context (128 for tiny) minus the graph's largest
        ``max_new_tokens`` (16); ``check`` says it, the tokenizer is loaded once for both splits."""
        import transformers
        rows = [dict(r) for r in USER]
        rows[9]["q"] = "copy " + "7" * 5000 + ":"
        source = write_jsonl(tmp_path / "user.jsonl", rows)
        loads, real = [], transformers.AutoTokenizer.from_pretrained
        monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: loads.append(a) or real(*a, **k))
        plan = og.compile(DATA_GRAPH, overrides=user_overrides(source, split="'train[:30]'", eval_split="'train[30:]'"))
        assert "(split train[:30], 1 left out (longer than the model's context 128 - max_new_tokens 16 = 112 tokens))" \
            in str(plan), str(plan)
        assert plan.graph.data["filtered"] == 1 and plan.graph.data["split"]["left_out"] == [9]
        assert plan.graph.data["limit"] == {"tokens": 112, "context": 128, "max_new_tokens": 16}
        assert len(loads) == 1
        bigger = task("nodes.generate.max_new_tokens=48", source=source, **USER_FIELDS)
        assert bigger.describe()["limit"]["tokens"] == 80 and bigger.describe()["filtered"] == 1
        assert task(source=source, **{**USER_FIELDS, "max_prompt_tokens": 100000}).describe()["filtered"] == 0
        with pytest.raises(og.GraphError, match=r"task.max_prompt_tokens: 1 prompt\(s\) of split 'train' are longer "
                                                r"than the model's context 128 - max_new_tokens 16 = 112 tokens \(row 9: "):
            task(source=source, on_long="error", **USER_FIELDS)
        spec = og.load(DATA_GRAPH, user_overrides(source))
        assert plugins.task_arguments(spec, plugins.task_factory(spec)[1], "dataset")["max_new_tokens"] == 16

        def factory(prompts, seed=0, eval_prompts=64, *, source, prompt="prompt", answer="answer", split="train",
                    eval_split=None, epochs=None):
            return None
        assert "max_new_tokens" not in plugins.task_arguments(spec, factory, "mine")   # where the factory takes it

    def test_rows_are_known_by_their_own_id_in_meta_the_ledger_and_its_report(self, tmp_path):
        source = write_jsonl(tmp_path / "user.jsonl", USER)
        t = task(source=source, **{**USER_FIELDS, "split": "'train[:30]'", "eval_split": "'train[30:]'"})
        assert all(p.meta["id"] == f"q-{p.meta['row']}" for s in range(3) for p in t.batch(s))
        assert [p.meta["id"] for p in t.eval_set()] == [f"q-{i}" for i in range(30, 40)]
        uid = write_jsonl(tmp_path / "uid.jsonl", [{**r, "uid": 1000 + i} for i, r in enumerate(USER)])
        assert all(p.meta["id"] == str(1000 + p.meta["row"]) for p in task(source=uid, id_field="uid", **USER_FIELDS).batch(0))
        assert "id" not in task(source=source, id_field="null", **USER_FIELDS).batch(0)[0].meta
        dup = [dict(r) for r in USER]
        dup[7]["id"] = "q-2"
        with pytest.raises(og.GraphError, match="task.id_field: rows 2 and 7 of split 'train' have the same id 'q-2'"):
            task(source=write_jsonl(tmp_path / "dup.jsonl", dup), **USER_FIELDS)
        with pytest.raises(og.GraphError, match="task.id_field: the rows have no field 'key'"):
            task(source=source, id_field="key", **USER_FIELDS)
        over = user_overrides(source) + ["schedule.iterations=2", "runtime.executor=local", "checkpoint.every=null",
                                         "nodes.generate.eval_every=0"]
        plan = og.compile(DATA_GRAPH, overrides=over)
        res = run(plan, run_dir=tmp_path / "runs", progress=False)
        made = [e for e in map(json.loads, (res.run_dir / "ledger.jsonl").read_text().splitlines())
                if e["event"] == "generated"]
        assert len(made) == 32 and all(e["id"] == f"q-{e['row']}" for e in made)
        never = sorted(set(range(40)) - {e["row"] for e in made})
        p = omnigraph("ledger", str(res.run_dir))
        shown = ", ".join(f"q-{i}" for i in never[:8]) + (", ..." if len(never) > 8 else "")
        assert p.returncode == 0 and f"rows never reached:      {len(never)} (ids {shown})" in p.stdout, p.stdout
        check_data(res.run_dir, og.compile(DATA_GRAPH, overrides=over))       # the resume check: the same data
        source.write_text(source.read_text().replace('"q-5"', '"q-five"'))
        with pytest.raises(og.GraphError, match="task.source: the data changed since the run started"):
            check_data(res.run_dir, og.compile(DATA_GRAPH, overrides=over))


class TestPaths:
    def test_a_relative_source_is_relative_to_the_graph_files_folder_or_on_the_command_line_to_the_cwd(self, tmp_path):
        (tmp_path / "data").mkdir()
        (tmp_path / "graphs").mkdir()
        write_jsonl(tmp_path / "data" / "user.jsonl", USER)
        raw = yaml.safe_load(DATA_GRAPH.read_text())
        raw["task"].update(source="../data/user.jsonl", prompt="q", answer="a", split="train[:30]",
                           eval_split="train[30:]", epochs=None)
        graph = tmp_path / "graphs" / "mine.yaml"
        graph.write_text(yaml.safe_dump(raw))
        assert og.load(graph).task.source == str(tmp_path / "data" / "user.jsonl")
        assert og.load(DATA_GRAPH).task.source == str(ROOT / "data" / "digits_copy.jsonl")
        assert og.load(RG_GRAPH).task.source == "reasoning_gym"                     # a task's name is no path
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        for g, rows in ((graph, 30), (DATA_GRAPH, 340)):
            p = omnigraph("check", str(g), cwd=elsewhere)
            assert p.returncode == 0 and f"{rows} rows from" in p.stdout, p.stderr
        assert og.load(graph, ["task.source=data/user.jsonl"]).task.source == "data/user.jsonl"   # as given
        p = omnigraph("check", str(graph), "task.source=data/user.jsonl", cwd=tmp_path)
        assert p.returncode == 0 and f"30 rows from {tmp_path / 'data' / 'user.jsonl'}" in p.stdout, p.stderr
        p = omnigraph("check", str(graph), "task.source=data/user.jsonl", cwd=elsewhere)
        assert p.returncode == 1 and "task.source: no such file or folder 'data/user.jsonl'" in p.stderr, p.stderr

    def test_a_runs_config_yaml_names_no_task_and_compiles_again_from_anywhere(self, tmp_path, monkeypatch):
        """What ``--resume`` compiles: the run directory's ``config.yaml``, with no ``task.name`` beside the source
        and the source absolute (here a relative one from the command line)."""
        plan = og.compile(DATA_GRAPH, overrides=["task.source=data/digits_copy.jsonl"])
        out = tmp_path / "run"
        out.mkdir()
        write_header(out, plan)
        task_ = yaml.safe_load((out / "config.yaml").read_text())["task"]
        assert "name" not in task_ and task_["source"] == str(ROOT / "data" / "digits_copy.jsonl")
        assert "name" not in yaml.safe_load(og.dump(plan.graph.spec))["task"]
        assert yaml.safe_load(og.dump(og.load(GRAPHS / "grpo_sync.yaml", ["task.name=arithmetic"])))["task"] == \
            {"name": "arithmetic"}                                          # a named task keeps its name
        monkeypatch.chdir(tmp_path)
        again = og.compile(out / "config.yaml")
        assert again.graph.data == plan.graph.data
        check_data(out, again)


class TestReasoningGym:
    def test_training_never_sees_a_held_out_question(self):
        spec = og.load(RG_GRAPH, ["task.prompts=64"])
        t = plugins.make_task(spec)
        train = {p.meta["data"]["question"] for s in range(20) for p in t.batch(s)}
        held = {p.meta["data"]["question"] for p in t.eval_set()}
        assert len(held) == 64 and not train & held

    def test_the_reward_is_the_datasets_own_score_of_the_librarys_own_extraction(self):
        import reasoning_gym as rg
        from reasoning_gym.utils import extract_answer
        spec = og.load(RG_GRAPH)
        t = plugins.make_task(spec)
        fn, lenient = plugins.load("rewards", "reasoning_gym"), plugins.load("rewards", "reasoning_gym_lenient")
        ds = rg.create_dataset(spec.task.options["dataset"], size=1000, seed=0, **spec.task.options["config"])
        lenient_above = 0
        for p in t.batch(3)[:4]:
            answer = p.meta["target"]
            replies = (answer, f"<answer>{answer}</answer>", f"<answer> {answer} </answer> done", f"It is {answer}.",
                       f"The result is <answer>{answer}", "no idea", f"<answer>1</answer> <answer>{answer}</answer>")
            for reply in replies:
                assert fn(p.text, reply, **p.meta) == ds.score_answer(extract_answer(reply), p.meta["data"]), reply
                loose = ds.score_answer(extract_answer(reply) or reply.strip(), p.meta["data"])
                assert lenient(p.text, reply, **p.meta) == loose, reply
                lenient_above += loose > fn(p.text, reply, **p.meta)
            assert fn(p.text, f"<answer>{answer}</answer>", **p.meta) == 1.0
            assert fn(p.text, f"It is {answer}.", **p.meta) == 0.0      # no tags: no answer, as the library reads it
        assert lenient_above > 0                                         # the lenient one credits untagged replies

    def test_fewshot_examples_come_before_each_question_and_are_never_trained_or_evaluated(self):
        spec = og.load(RG_GRAPH, ["task.options.fewshot=2", "task.options.fewshot_answer='<answer>{answer}</answer>'",
                                  "task.system=Be brief."])
        t = plugins.make_task(spec)
        p = t.batch(0)[0]
        roles = [m["role"] for m in p.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"] and p.chat
        assert p.messages[-1]["content"] == p.text and p.messages[2]["content"].startswith("<answer>")
        shots = {m["content"] for m in p.messages[1:-1:2]}
        seen = {q.text for s in range(20) for q in t.batch(s)} | {q.text for q in t.eval_set()}
        assert len(shots) == 2 and not shots & seen
        assert all(q.messages[:-1] == p.messages[:-1] for q in t.eval_set()[:5])     # the same examples
        assert "2 solved example(s) before each question" in str(og.compile(spec))

    def test_a_fewshot_template_over_a_missing_field_and_fewshot_on_files_are_refused(self):
        with pytest.raises(og.GraphError, match=r"task.options.fewshot_answer: the template names 'solution'"):
            og.compile(RG_GRAPH, overrides=["task.options.fewshot=1", "task.options.fewshot_answer='{solution}'"])
        with pytest.raises(og.GraphError, match=r"task.options.fewshot: unknown task dataset option 'fewshot' "
                                                r"\(known: it takes none\)"):
            og.compile(DATA_GRAPH, overrides=["task.options.fewshot=1"])

    def test_an_unknown_dataset_suggests_the_closest_and_a_bad_config_names_the_field(self):
        with pytest.raises(og.GraphError, match="task.options.dataset: reasoning-gym has no dataset 'chain_summ' "
                                                "\\(did you mean 'chain_sum'"):
            og.compile(RG_GRAPH, overrides=["task.options.dataset=chain_summ"])
        with pytest.raises(og.GraphError, match="task.options.config: reasoning-gym rejected the configuration"):
            og.compile(RG_GRAPH, overrides=["task.options.config={min_terms: 5, max_terms: 2}"])


class TestVerifiers:
    @pytest.mark.parametrize("reply, target, score", [
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0), ("so x = 1/2", "\\frac{1}{2}", 1.0),
        ("\\boxed{3}", "4", 0.0), ("I do not know", "4", 0.0), ("$2\\sqrt{2}$", "\\sqrt{8}", 1.0)])
    def test_math_verify_compares_answers_mathematically(self, reply, target, score):
        assert plugins.load("rewards", "math_verify")("q", reply, target=target) == score

    def test_exact_match_strips_whitespace_only(self):
        fn = plugins.load("rewards", "exact_match")
        assert fn("q", " Paris\n", target="Paris") == 1.0 and fn("q", "paris", target="Paris") == 0.0


def generated_rows(run_dir: Path) -> dict[int, tuple[int, int]]:
    return {e["group"]: (e["row"], e["epoch"]) for e in map(json.loads, (run_dir / "ledger.jsonl").read_text().splitlines())
            if e["event"] == "generated"}


@pytest.mark.slow
def test_the_dataset_graph_trains_and_the_ledger_says_which_rows(tmp_path):
    """60 steps over 340 rows (2.8 epochs) on the local executor: the reward rises, every row is trained, and
    the plan, data.json and the ledger agree on the rows."""
    plan = og.compile(DATA_GRAPH, overrides=["runtime.executor=local"])
    assert "340 rows from" in str(plan) and "2.82 epochs of 3" in str(plan)
    res = run(plan, run_dir=tmp_path, progress=False)
    rewards = [r["reward_mean"] for r in res.metrics if "reward_mean" in r]
    assert sum(rewards[-5:]) / 5 >= sum(rewards[:5]) / 5 + 0.3, rewards
    assert json.loads((res.run_dir / "data.json").read_text())["rows"] == 340
    s = read(res.run_dir)
    assert s.ok and s.rows["total"] == 340 and len(s.rows["trained"]) == 340 and s.rows["never_reached"] == []
    assert s.rows["epochs"] == 3
    p = omnigraph("ledger", str(res.run_dir))
    assert p.returncode == 0 and "dataset rows trained:    340 of 340 over 3 epoch(s)" in p.stdout, p.stdout


@pytest.mark.slow
def test_a_resumed_run_continues_with_the_next_unseen_row_and_refuses_changed_data(tmp_path, monkeypatch):
    """Interrupted at step 7, resumed from the step-5 checkpoint: every prompt group gets the same row as in an
    uninterrupted run, none twice; a data file changed meanwhile is refused before anything runs."""
    data = write_jsonl(tmp_path / "rows.jsonl", [{"number": str(1000 + i), "answer": str(1000 + i)} for i in range(50)])
    over = [f"task.source={data}", "task.epochs=null", "schedule.iterations=9", "checkpoint.every=3",
            "runtime.executor=local", "nodes.generate.eval_every=0", "task.eval_split=null", "task.split=train"]
    whole = run(og.compile(DATA_GRAPH, overrides=over), run_dir=tmp_path / "a", progress=False).run_dir
    monkeypatch.setenv("OMNIGRAPH_INJECT", "update@7:raise")
    with pytest.raises(NodeFailure):
        run(og.compile(DATA_GRAPH, overrides=over), run_dir=tmp_path / "b", progress=False)
    monkeypatch.delenv("OMNIGRAPH_INJECT")
    (d,) = (tmp_path / "b").iterdir()
    run(og.compile(d / "config.yaml"), resume=d, progress=False)
    assert generated_rows(d) == generated_rows(whole)
    s = read(d)
    assert s.ok and s.rows["total"] == 50 and len(s.rows["trained"]) + len(s.rows["never_reached"]) == 50
    assert s.generated == 9 * 16 and s.rows["epochs"] == 3          # 144 prompts over 50 rows
    data.write_text(data.read_text().replace("1007", "7001"))
    with pytest.raises(og.GraphError, match="task.source: the data changed since the run started"):
        run(og.compile(d / "config.yaml"), resume=d, progress=False)


@pytest.mark.slow
def test_the_reasoning_gym_graph_trains_end_to_end(tmp_path):
    """The shipped reasoning-gym graph, SmolLM2 through transformers on the local executor, 3 small steps:
    questions from reasoning-gym with the solved example, scored by the dataset's own score_answer, greedy
    eval on held-out questions at the first and last step, the adapters updated. (That it learns is what
    bench/learn.py measures: 18 steps of 24 samples.)"""
    over = ["runtime.executor=local", "nodes.generate.backend=hf", "nodes.generate.options={}",
            "task.prompts=2", "task.samples_per_prompt=2", "task.eval_prompts=4", "schedule.iterations=3",
            "nodes.generate.eval_every=2", "checkpoint.every=null"]
    res = run(og.compile(RG_GRAPH, overrides=over), run_dir=tmp_path, progress=False)
    rows = [r for r in res.metrics if "reward_mean" in r]
    assert len(rows) == 3 and all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    evals = [r["eval_accuracy"] for r in res.metrics if "eval_accuracy" in r]
    assert len(evals) >= 2 and all(0.0 <= a <= 1.0 for a in evals)
    assert len([r for r in res.metrics if "grad_norm" in r]) == 3          # one step off: batches 0, 1, 2 trained
    assert read(res.run_dir).ok and (res.run_dir / "final" / "adapter").is_dir()


def test_no_held_out_split_is_a_warning_at_check_and_a_run_without_evaluation(tmp_path):
    """``task.eval_split: null`` with a generator that evaluates: ``check`` says there will be no evaluation, and
    the run trains without one (it died at its first step on an empty held-out set)."""
    from omnigraph.runtime import run
    plan = og.compile(DATA_GRAPH, overrides=["task.eval_split=null", "schedule.iterations=2", "runtime.executor=local",
                                             "nodes.generate.eval_every=1"])
    assert any("holds no prompts out" in w for w in plan.warnings), plan.warnings
    rows = run(plan, run_dir=tmp_path, progress=False).metrics
    assert not any("eval_accuracy" in r for r in rows) and sum("reward_mean" in r for r in rows) == 2
