"""mkdocs hooks (``hooks:`` in ``mkdocs.yml``): the benchmark records on the site, and the benchmarks page.

- Every file of ``bench/results/`` (the JSON records ``bench/record.py`` writes, and their plots) is added to
  the site under ``bench/results/``, so a figure's ``[src](bench/results/<record>.json#<key.path>)`` marker
  links to its record there.
- The markers are written relative to the repository root in every page (``tests/test_bench_results.py``
  reads them so); each page's links into ``bench/results/`` are made relative to the page as it is built.
- ``<!-- benchmark-tables -->`` in a page is replaced by one table per benchmark, made from the records at
  build time (newest first): the date (a link to the record), the machine (its GPU, else its CPU model), the
  revision and the benchmark's headline figures. No figure is copied by hand.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PLACEHOLDER = "<!-- benchmark-tables -->"
LINK = re.compile(r"(\]\()(bench/results/)")

# What each benchmark measures (the command that writes it) and its headline figures:
# (column, key path in the record's result, scale). A record without a key shows a dash.
BENCHES: dict[str, tuple[str, str, list[tuple[str, str, float]]]] = {
    "make_run": ("`make run`", "the shipped one-step-off graph on the tiny model, end to end", [
        ("wall s", "wall_s", 1), ("s/step", "s_per_step", 1), ("start-up s", "startup_s", 1),
        ("reward first", "reward_first", 1), ("reward last", "reward_last", 1),
        ("max staleness", "observed_max_staleness", 1)]),
    "quality": ("`python bench/quality.py --quick`", "every schedule over seeds: final reward and time to 0.9", [
        ("sync final", "modes.sync.final_mean", 1), ("one-step-off final", "modes.one_step_off.final_mean", 1),
        ("async 2 final", "modes.async2.final_mean", 1), ("partial final", "modes.partial.final_mean", 1),
        ("one-step-off time ratio", "time_to_target_ratio_one_step_off", 1),
        ("one-step-off gap sigma", "gap_sigma_one_step_off", 1), ("minutes", "minutes", 1)]),
    "pipeline": ("`python bench/pipeline.py --quick`", "synthetic nodes of known cost: overlap and control overhead", [
        ("speedup", "speedup", 1), ("efficiency", "efficiency", 1), ("CPU efficiency", "cpu_efficiency", 1),
        ("compiled ms/step", "compiled_overhead_ms", 1), ("actor calls ms/step", "tasks_overhead_ms", 1),
        ("idle actor % of a core", "idle_actor_cpu_pct", 1)]),
    "parity": ("`python bench/parity.py --quick`", "sync against one-step-off GRPO on the tiny model, one seed", [
        ("sync s/step", "sync_s_per_step", 1), ("one-step-off s/step", "one_step_off_s_per_step", 1),
        ("speedup", "speedup", 1), ("sync final reward", "final_reward_sync", 1),
        ("one-step-off final reward", "final_reward_one_step_off", 1)]),
    "vs_trl": ("`python bench/vs_trl.py --quick`", "the same training with TRL's GRPOTrainer", [
        ("TRL s/step", "trl_s_per_step", 1), ("sync s/step", "omnigraph.colocated_sync.s_per_step", 1),
        ("one-step-off s/step", "omnigraph.one_step_off.s_per_step", 1), ("TRL / sync", "speedup_sync", 1),
        ("TRL / best", "speedup_best", 1), ("start-up s", "omnigraph_startup_s", 1),
        ("TRL start-up s", "trl_startup_s", 1)]),
    "preempt": ("`python bench/preempt.py --quick`", "SIGTERM into real runs, the job run again", [
        ("survived", "survived", 1), ("of", "of", 1), ("signal to exit s", "max_signal_to_exit_s", 1)]),
    "faults": ("`python bench/faults.py --quick`", "faults inside the work and SIGKILLs from outside", [
        ("injected", "faults_injected", 1), ("seen", "faults_observed", 1), ("survived", "faults_survived", 1),
        ("groups lost", "groups_lost", 1), ("trained twice", "groups_trained_twice", 1),
        ("fuzz cases", "fuzz_cases", 1), ("tracebacks", "fuzz_tracebacks", 1), ("hangs", "fuzz_hangs", 1)]),
    "soak": ("`python bench/soak.py --quick`", "300 steps on ray under 15 faults of five kinds, against the run left alone", [
        ("injected", "faults_injected", 1), ("survived", "faults_survived", 1), ("restarts", "restarts", 1),
        ("requeues", "requeues", 1), ("bit exact", "bit_exact", 1), ("groups lost", "groups_lost", 1),
        ("NaN guard", "nan_guard_fired", 1), ("RSS MB / 1000 steps", "rss_growth_mb_per_1000_steps", 1),
        ("wall s", "wall_s", 1)]),
    "agent": ("`python bench/agent.py --quick`", "the same episodes through the agents' endpoint and the episode loop", [
        ("loop s/step", "loop_s_per_step", 1), ("endpoint s/step", "agent_s_per_step", 1),
        ("overhead", "endpoint_overhead", 1), ("same training", "same_training", 1), ("in flight", "max_in_flight", 1),
        ("token gap", "token_exact_gap", 1), ("mismatch", "retokenize_mismatch", 1),
        ("mismatch, edited", "retokenize_mismatch_edited", 1)]),
    "learn": ("`python bench/learn.py --quick`", "SmolLM2 through vLLM on a reasoning-gym task, held-out accuracy", [
        ("accuracy before", "eval_before", 1), ("accuracy after", "eval_after", 1), ("steps", "steps", 1),
        ("minutes", "minutes", 1)]),
    "multiturn": ("`python bench/multiturn.py --quick`", "SmolLM2 learns to use a calculator tool", [
        ("reward first", "reward_first", 1), ("reward last", "reward_last", 1),
        ("tool calls first", "tool_calls_per_episode_first", 1), ("tool calls last", "tool_calls_per_episode", 1),
        ("held-out before", "eval_before", 1), ("held-out after", "eval_after", 1),
        ("overlap %", "env_overlap_efficiency", 100)]),
    "partial": ("`python bench/partial.py --quick`", "long-tailed completions with and without partial rollouts", [
        ("without s/step", "s_per_step_full", 1), ("with s/step", "s_per_step_partial", 1), ("speedup", "speedup", 1),
        ("max staleness", "observed_max_staleness", 1), ("bound", "static_bound", 1),
        ("reward last without", "reward_last_full", 1), ("reward last with", "reward_last_partial", 1)]),
    "diffusion": ("`python bench/diffusion.py --quick`", "FlowGRPO on the tiny image model, sync against async", [
        ("sync s/step", "s_per_step_sync_separate", 1), ("async s/step", "s_per_step_async", 1),
        ("speedup", "speedup", 1), ("ideal", "ideal_speedup", 1), ("sync reward last", "sync_reward_last", 1),
        ("async reward last", "reward_last", 1)]),
    "levers": ("`python bench/levers.py --quick`", "delta sync, lending an idle trainer, the layout advisor", [
        ("delta bytes (bf16, lr 1e-6)", "delta_bytes_fraction_bf16_lr1e-6", 1),
        ("dense ms", "full_sync_s_bf16_lr1e-6", 1000), ("delta ms", "delta_sync_s_bf16_lr1e-6", 1000),
        ("lending speedup", "lend_speedup", 1), ("predicted", "lend_predicted_speedup", 1),
        ("advisor error", "advisor_pred_error", 1)]),
    "startup": ("`python bench/startup.py`", "the shipped graph started with warm workers and cold", [
        ("warm s", "warm_startup_s", 1), ("cold s", "cold_startup_s", 1), ("speedup", "speedup", 1)]),
    "generate": ("`python bench/generate.py --quick`", "vLLM against transformers, tokens per second", [
        ("hf tok/s", "hf_tok_s", 1), ("vLLM tok/s", "vllm_tok_s", 1), ("ratio", "ratio", 1),
        ("tiny model ratio", "tiny_ratio", 1)]),
    "weight_sync": ("`python bench/weight_sync.py --quick`", "full and LoRA sync into the live vLLM engine", [
        ("full sync s", "full_sync_s", 1), ("% of a memcpy", "fraction_of_memcpy", 100),
        ("memcpy GB/s", "memcpy_gb_s", 1), ("first sync s", "full_first_sync_s", 1), ("LoRA s", "lora_sync_s", 1),
        ("LoRA merged s", "lora_merged_sync_s", 1)]),
    "vllm_layout": ("`python bench/vllm_layout.py --quick`", "vLLM's weight layout against omnigraph's refilled one", [
        ("tok/s ratio, 32 seqs", "gen_ratio_32", 1), ("tok/s ratio, 128 seqs", "gen_ratio_128", 1),
        ("load ratio", "load_ratio", 1)]),
    "precision": ("`python bench/precision.py --quick`", "the trainer in float32 against bf16 mixed precision", [
        ("fp32 s", "fp32_s", 1), ("bf16 s", "bf16_s", 1), ("speedup", "speedup", 1)]),
    "smollm2_run": ("`omnigraph run graphs/smollm2_vllm_one_step_off.yaml`", "SmolLM2-135M with LoRA through vLLM", [
        ("wall s", "wall_s", 1), ("s/step", "s_per_step", 1), ("reward first", "reward_first", 1),
        ("reward last", "reward_last", 1), ("held-out first", "eval_reward_first", 1),
        ("held-out last", "eval_reward_last", 1)]),
    "gpu": ("`python bench/gpu.py`", "on a CUDA GPU: generation, weight sync, sync against one-step-off (Qwen2-0.5B shape)", [
        ("eager tok/s", "models.0.gen_tokens_per_s_eager", 1), ("static tok/s", "models.0.gen_tokens_per_s_static", 1),
        ("static speedup", "models.0.gen_speedup_static", 1), ("sync ms", "models.0.sync_total_s", 1000),
        ("% of a device copy", "models.0.ipc_fraction_of_device_copy", 100),
        ("sync s/step", "runtime.sync.s_per_step", 1), ("one-step-off s/step", "runtime.one_step_off.s_per_step", 1),
        ("speedup", "one_step_off_speedup", 1)]),
    "scale": ("`python bench/scale.py --quick`", "a sharded trainer, a two-node cluster, Ray Direct Transport", [
        ("FSDP max diff", "fsdp_max_abs_diff", 1), ("state per rank", "fsdp_mem_ratio", 1),
        ("FSDP update s", "fsdp_update_s", 1), ("one actor s", "single_update_s", 1),
        ("cluster ray s/step", "cluster_ray_s_per_step", 1), ("cluster ray-tasks s/step", "cluster_ray_tasks_s_per_step", 1),
        ("RDT GB/s", "rdt_gb_s", 1), ("object store GB/s", "object_store_gb_s", 1)]),
    "scale_gpu": ("`python bench/scale.py --gpu --quick`", "FSDP2 over NCCL next to one unsharded actor", [
        ("FSDP max diff", "fsdp_max_abs_diff", 1), ("sharded s/step", "gpu_fsdp_s_per_step", 1),
        ("one actor s/step", "gpu_single_s_per_step", 1), ("sharded reward last", "gpu_fsdp_reward_last", 1),
        ("one actor reward last", "gpu_single_reward_last", 1)]),
}


def records() -> dict[str, list[tuple[str, dict]]]:
    """``bench -> [(file name, record), ...]``, newest first."""
    out: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        rec = json.loads(path.read_text())
        out.setdefault(rec.get("bench", path.stem.rsplit("-", 2)[0]), []).append((path.name, rec))
    for recs in out.values():
        recs.sort(key=lambda r: r[1].get("date", ""), reverse=True)
    return out


def lookup(result: dict, path: str):
    """The value at a dotted key path (list items by index); None where there is none."""
    obj = result
    for part in path.split("."):
        if isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        elif isinstance(obj, dict) and part in obj:
            obj = obj[part]
        else:
            return None
    return obj


def figure(value, scale: float) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, (int, float)) or math.isnan(value):
        return "—"
    value = value * scale
    if float(value).is_integer() and abs(value) < 1e6:
        return f"{int(value):,}"
    return f"{value:,.4g}" if abs(value) >= 1 else f"{value:.3g}"


def machine(rec: dict) -> str:
    """The GPU a record ran on, else its CPU model, cores and the flags that decide bf16 (AMX, AVX512-BF16)."""
    m = rec.get("machine") or {}
    gpus = [g.get("name", "") if isinstance(g, dict) else str(g) for g in m.get("gpus") or []]
    if gpus:
        return f"{len(gpus)} × {gpus[0]}" if len(gpus) > 1 else gpus[0]
    parts = [m.get("cpu_model") or "?"]
    cores = (m.get("cores") or {}).get("affinity") or (m.get("cores") or {}).get("os_cpu_count")
    if cores:
        parts.append(f"{cores} cores")
    flags = m.get("cpu_flags") or {}
    extra = [name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16")) if flags.get(flag)]
    if not extra and flags.get("avx2"):
        extra = ["AVX2 only"] if not flags.get("avx512f") else ["AVX-512"]
    return ", ".join(parts + extra)


def table(bench: str, recs: list[tuple[str, dict]], prefix: str) -> str:
    command, what, heads = BENCHES.get(bench, (f"`{bench}`", "", []))
    if not heads:        # a benchmark this page does not know yet: its first numbers
        first = recs[0][1].get("result", {})
        heads = [(k, k, 1) for k, v in first.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)][:6]
    lines = [f"### {bench}", "", f"{command}: {what}." if what else command, "",
             "| date | machine | revision | " + " | ".join(h for h, _, _ in heads) + " |",
             "| --- | --- | --- | " + " | ".join("---:" for _ in heads) + " |"]
    for name, rec in recs:
        date = str(rec.get("date", ""))[:16].replace("T", " ")
        rev = str(rec.get("git_rev", ""))[:8] + (" (dirty)" if rec.get("dirty") else "")
        cells = [figure(lookup(rec.get("result", {}), path), scale) for _, path, scale in heads]
        lines.append(f"| [{date}]({prefix}bench/results/{name}) | {machine(rec)} | `{rev}` | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def tables(prefix: str) -> str:
    recs = records()
    order = [b for b in BENCHES if b in recs] + sorted(b for b in recs if b not in BENCHES)
    return "\n".join(table(b, recs[b], prefix) for b in order)


# ---------------------------------------------------------------- mkdocs events

def on_files(files, config):
    for path in sorted(RESULTS.iterdir()):
        if path.is_file() and path.suffix in (".json", ".png"):
            files.append(File.generated(config, f"bench/results/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page, config, files):
    prefix = "../" * page.file.src_uri.count("/")
    markdown = LINK.sub(lambda m: m.group(1) + prefix + m.group(2), markdown)
    if PLACEHOLDER in markdown:
        markdown = markdown.replace(PLACEHOLDER, tables(prefix))
    return markdown
