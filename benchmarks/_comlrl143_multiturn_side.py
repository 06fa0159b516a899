"""CoMLRL 1.4.3 side of the multi-turn story throughput benchmark (runs in their own venv).

Reads a JSON spec, trains the published ``comlrl==1.4.3`` MAGRPO (two agents, ``num_turns``
turns with ``_story_reward.transition`` as ``external_transition``, the cooperative
``_story_reward.story_reward``), and writes a JSON result::

    <venv-comlrl143>/bin/python benchmarks/_comlrl143_multiturn_side.py --spec SPEC.json --out OUT.json

Spec (JSON object; * = required):

    model_dirs*          list[str]  one local HF model folder per agent (e.g. stories260k twice)
    examples_path*       str        JSON list of example dicts (``story_examples``), used in order:
                                    the first ``warmup*batch_size`` for the warm-up, the next
                                    ``steps*batch_size`` for the measured run
    batch_size*          int        prompts per step
    steps*               int        measured steps
    warmup               int   1    warm-up steps (not timed)
    num_turns            int   2
    num_generations      int   4    G
    max_new_tokens       int   64
    temperature          float 1.0  (top_p 1.0 and top_k None unless given)
    top_p                float 1.0
    top_k                int|null null
    learning_rate        float 1e-3
    joint_mode           str   "aligned"
    early_termination_threshold  float|null  null  (their default, -0.2, would stop every
                                    node whose mean reward > -0.2, i.e. every story node)
    advantage_normalization  bool  false  (group mean baseline only, as on our side)
    advantage_mode       str   "mean"
    rollout_buffer_size  int|null  null -> batch_size * nodes_per_prompt (see below)
    train_batch_size     int|null  null -> rollout_buffer_size
    seed                 int   0
    threads              int   1    torch.set_num_threads
    story_module_dir     str   this script's folder (where ``_story_reward.py`` lives)

What one "step" is on their side: their loop takes one prompt at a time and builds its
rollout tree: per node each agent samples G completions with one ``generate`` call; in
aligned mode every one of the G joint actions opens a child node at the next turn (all
branches, not only the best), so a prompt has ``nodes_per_prompt = sum_{t<T} G^t`` nodes
(5 for G=4, T=2). Each node adds one sample per agent to that agent's rollout buffer, and
the buffer is trained on once it holds ``rollout_buffer_size`` samples, one turn at a time
(turn 1 first), in mini-batches of ``train_batch_size`` samples with one optimizer step each.
With the defaults (``rollout_buffer_size = train_batch_size = batch_size * nodes_per_prompt``)
one step = ``batch_size`` prompts and ``num_turns`` optimizer steps per agent (one per turn).

Timing: ``MAGRPOTrainer.train()`` (their public loop) over ``steps * batch_size`` prompts,
after a warm-up ``train()`` over ``warmup * batch_size`` other prompts. Stage seconds come
from wrapping the trainer's own methods on the instance (``_generate_completions``,
``_compute_rewards``, ``_update_from_samples``); nothing in their code is changed. The turn
of a generate call is known from its ``external_prompts`` argument (None only at turn 1);
a ``_compute_rewards`` call belongs to the node generated just before it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _bench_common import dist_version, side_spec


def main() -> int:
    spec, out_path = side_spec(__doc__.splitlines()[0])

    import numpy as np
    import torch

    torch.set_num_threads(int(spec.get("threads", 1)))

    story_dir = spec.get("story_module_dir") or str(Path(__file__).resolve().parent)
    sys.path.insert(0, story_dir)
    import _story_reward as story  # noqa: E402  (the shared, dependency-free task)
    import transformers
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    model_dirs = list(spec["model_dirs"])
    num_agents = len(model_dirs)
    if num_agents != 2:
        raise SystemExit(
            f"the story task has 2 agents (beginning, ending); got {num_agents} model_dirs"
        )
    b = int(spec["batch_size"])
    steps = int(spec["steps"])
    warmup = int(spec.get("warmup", 1))
    num_turns = int(spec.get("num_turns", 2))
    G = int(spec.get("num_generations", 4))
    joint_mode = str(spec.get("joint_mode", "aligned"))
    joint_per_node = G**num_agents if joint_mode == "cross" else G
    nodes_per_prompt = sum(joint_per_node**t for t in range(num_turns))
    buffer_size = int(spec.get("rollout_buffer_size") or b * nodes_per_prompt)
    train_bs = int(spec.get("train_batch_size") or buffer_size)

    examples = json.loads(Path(spec["examples_path"]).read_text())
    need = (warmup + steps) * b
    if len(examples) < need:
        raise SystemExit(f"{spec['examples_path']} has {len(examples)} examples; {need} needed")
    warm_items = examples[: warmup * b]
    meas_items = examples[warmup * b : need]

    state: dict[str, Any] = {"turn": 0, "turn_next": 2}  # turn of the node being built

    # CoMLRL's reward form for two agents: reward_func(*completions, batch_items=[item]);
    # their aligned mode calls it once per joint action with one-element lists.
    # The unweighted reward parts are recorded per turn too (reward_parts_mean_by_turn).
    parts_sum: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    parts_n: dict[int, int] = defaultdict(int)

    def reward_func(*completions, batch_items=None):
        out = story.story_reward(list(completions[0]), list(completions[1]), batch_items[0])
        turn = state["turn"]
        for beg, end in zip(completions[0], completions[1]):
            for k, v in story.reward_parts(beg, end, batch_items[0]).items():
                parts_sum[turn][k] += v
            parts_n[turn] += 1
        return out

    cfg = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=float(spec.get("learning_rate", 1e-3)),
        logging_steps=1,
        num_agents=num_agents,
        num_generations=G,
        max_new_tokens=int(spec.get("max_new_tokens", 64)),
        temperature=float(spec.get("temperature", 1.0)),
        top_p=float(spec.get("top_p", 1.0)),
        top_k=spec.get("top_k"),
        num_turns=num_turns,
        joint_mode=joint_mode,
        early_termination_threshold=spec.get("early_termination_threshold"),
        eval_interval=0,
        rollout_buffer_size=buffer_size,
        train_batch_size=train_bs,
        advantage_normalization=bool(spec.get("advantage_normalization", False)),
        advantage_mode=str(spec.get("advantage_mode", "mean")),
    )
    seed = int(spec.get("seed", 0))
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    trainer = MAGRPOTrainer(
        agents=model_dirs,
        num_agents=num_agents,
        reward_func=reward_func,
        formatters=[story.make_formatter(a) for a in range(num_agents)],
        external_transition=story.transition if num_turns > 1 else None,
        train_dataset=warm_items,
        args=cfg,
        wandb_config=None,
    )

    # ---- instrumentation: wrap bound methods on the instance (their loop calls self.X) ----
    stats: dict[str, Any] = {}

    def reset_stats() -> None:
        stats.clear()
        stats.update(
            generate_s=0.0,
            reward_s=0.0,
            update_s=0.0,
            generate_s_turn=defaultdict(float),
            reward_s_turn=defaultdict(float),
            update_s_turn=defaultdict(float),
            generate_calls_turn=defaultdict(int),
            reward_calls_turn=defaultdict(int),
            tokens_turn=defaultdict(int),  # completion tokens up to (not incl.) EOS
            eos_turn=defaultdict(int),  # completions that ended with an EOS id
            padded_tokens_turn=defaultdict(int),  # rows * generated width (what generate ran)
            completions_turn=defaultdict(int),
            rewards_turn=defaultdict(list),  # every joint reward, per turn
            update_calls_turn=defaultdict(int),
            optimizer_steps=0,
            node_samples_turn=defaultdict(int),
            prompt_tokens_turn=defaultdict(list),
            updates=[],  # per _update_from_samples call (agent 0)
        )

    reset_stats()
    eos_ids: set[int] = set()
    for agent in trainer.agents:
        eos = agent.generation_config.eos_token_id
        eos_ids.update([eos] if isinstance(eos, int) else list(eos or []))
    orig_generate = trainer._generate_completions
    orig_rewards = trainer._compute_rewards
    orig_update = trainer._update_from_samples

    def generate(*a, **kw):
        turn = 1 if kw.get("external_prompts") is None else state["turn_next"]
        t0 = time.perf_counter()
        out = orig_generate(*a, **kw)
        dt = time.perf_counter() - t0
        state["turn"] = turn
        stats["generate_s"] += dt
        stats["generate_s_turn"][turn] += dt
        stats["generate_calls_turn"][turn] += 1
        lens = [int(x) for x in out["response_lens"]]
        rows = out["completion_input_ids"][0]
        width = int(rows[0].shape[0]) if rows else 0
        stats["tokens_turn"][turn] += sum(lens)
        # Stopped on an EOS id (the generation config's; stories260k: [1, 2]) before the cap.
        # response_len counts up to the first pad, so it includes the EOS token itself.
        stats["eos_turn"][turn] += sum(
            0 < n and int(row[n - 1]) in eos_ids for n, row in zip(lens, rows)
        )
        stats["padded_tokens_turn"][turn] += width * len(rows)
        stats["completions_turn"][turn] += len(lens)
        stats["prompt_tokens_turn"][turn].append(int(out["prompt_input_ids"].shape[1]))
        return out

    def compute_rewards(*a, **kw):
        t0 = time.perf_counter()
        out = orig_rewards(*a, **kw)
        dt = time.perf_counter() - t0
        turn = state["turn"]
        stats["reward_s"] += dt
        stats["reward_s_turn"][turn] += dt
        stats["reward_calls_turn"][turn] += len(out)
        stats["rewards_turn"][turn].extend(float(r) for r in out)
        return out

    def update_from_samples(agent_idx, samples):
        turn = int(samples[0].turn_idx) + 1 if samples else 0
        n = len(samples)
        t0 = time.perf_counter()
        out = orig_update(agent_idx, samples)
        dt = time.perf_counter() - t0
        stats["update_s"] += dt
        stats["update_s_turn"][turn] += dt
        stats["update_calls_turn"][turn] += 1
        stats["optimizer_steps"] += math.ceil(n / train_bs)
        stats["node_samples_turn"][turn] += n
        if agent_idx == 0:
            stats["updates"].append(
                {
                    "turn": turn,
                    "node_samples": n,
                    "reward_mean": float(np.mean([s.node_mean_reward for s in samples])),
                    "return_mean": float(np.mean([s.node_mean_return for s in samples])),
                }
            )
        return out

    # Their tree is built depth first and every child node's generate calls come right
    # after the external_transition call that made its prompts; that call's history length
    # (one prompt per turn played on the branch) gives the child's turn.
    orig_transition = trainer.external_transition
    if orig_transition is not None:

        def transition(**kw):
            # prompt_history_per_agent[i] holds one prompt per turn played on this branch.
            state["turn_next"] = len(kw["prompt_history_per_agent"][0]) + 1
            return orig_transition(**kw)

        trainer.external_transition = transition

    trainer._generate_completions = generate
    trainer._compute_rewards = compute_rewards
    trainer._update_from_samples = update_from_samples

    t0 = time.perf_counter()
    trainer.train()
    warm_s = time.perf_counter() - t0

    reset_stats()
    parts_sum.clear()
    parts_n.clear()
    trainer.train_dataset = meas_items
    c0 = os.times()
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    c1 = os.times()
    cpu_self = (c1.user - c0.user) + (c1.system - c0.system)

    prompts = len(meas_items)
    turns = sorted(set(stats["generate_calls_turn"]) | set(stats["rewards_turn"]))
    tokens = sum(stats["tokens_turn"].values())
    padded = sum(stats["padded_tokens_turn"].values())
    completions = sum(stats["completions_turn"].values())
    other = wall - stats["generate_s"] - stats["reward_s"] - stats["update_s"]

    def per_turn(key: str, fn=lambda v: v) -> dict[str, Any]:
        return {f"turn_{t}": fn(stats[key][t]) for t in turns}

    # Per-step reward curve (agent 0's updates; one entry per turn per step by default).
    curve: dict[str, list[float]] = defaultdict(list)
    for u in stats["updates"]:
        curve[f"turn_{u['turn']}"].append(u["reward_mean"])

    result = {
        "side": "comlrl==1.4.3",
        "prompts": prompts,
        "steps": steps,
        "batch_size": b,
        "wall_s": wall,
        "warmup_wall_s": warm_s,
        "prompts_per_s": prompts / wall,
        "step_s": wall / steps,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "padded_completion_tokens": padded,
        "padded_tokens_per_s": padded / wall,
        "completions": completions,
        "completion_len_mean": tokens / completions if completions else 0.0,
        "stage_s_per_step": {
            "generate": stats["generate_s"] / steps,
            "reward": stats["reward_s"] / steps,
            "update": stats["update_s"] / steps,
            "other": other / steps,
        },
        "stage_fraction": {
            "generate": stats["generate_s"] / wall,
            "reward": stats["reward_s"] / wall,
            "update": stats["update_s"] / wall,
            "other": other / wall,
        },
        "stage_s_per_step_by_turn": {
            "generate": per_turn("generate_s_turn", lambda v: v / steps),
            "reward": per_turn("reward_s_turn", lambda v: v / steps),
            "update": per_turn("update_s_turn", lambda v: v / steps),
        },
        "reward_mean_by_turn": per_turn("rewards_turn", lambda v: float(np.mean(v)) if v else None),
        "reward_std_by_turn": per_turn("rewards_turn", lambda v: float(np.std(v)) if v else None),
        "reward_mean_by_turn_per_step": dict(curve),
        "reward_parts_mean_by_turn": {  # unweighted, each in [0, 1]; weights: REWARD_WEIGHTS
            f"turn_{t}": {k: v / parts_n[t] for k, v in parts_sum[t].items()}
            for t in sorted(parts_n)
        },
        "completion_tokens_by_turn": per_turn("tokens_turn"),
        "completion_len_mean_by_turn": {
            f"turn_{t}": stats["tokens_turn"][t] / max(1, stats["completions_turn"][t])
            for t in turns
        },
        "eos_fraction_by_turn": {
            f"turn_{t}": stats["eos_turn"][t] / max(1, stats["completions_turn"][t]) for t in turns
        },
        "prompt_tokens_mean_by_turn": per_turn(
            "prompt_tokens_turn", lambda v: float(np.mean(v)) if v else None
        ),
        "per_prompt": {  # tree shape actually built, per prompt (both agents together)
            "generate_calls_by_turn": per_turn("generate_calls_turn", lambda v: v / prompts),
            "joint_actions_by_turn": per_turn("reward_calls_turn", lambda v: v / prompts),
            "node_samples_by_turn": per_turn("node_samples_turn", lambda v: v / prompts),
        },
        "per_step": {
            "update_calls_by_turn": per_turn("update_calls_turn", lambda v: v / steps),
            "optimizer_steps": stats["optimizer_steps"] / steps,
        },
        "cpu_self_s": cpu_self,
        "cpu_s_per_prompt": cpu_self / prompts,
        "config": {
            "num_agents": num_agents,
            "num_turns": num_turns,
            "num_generations": G,
            "joint_mode": joint_mode,
            "nodes_per_prompt": nodes_per_prompt,
            "rollout_buffer_size": buffer_size,
            "train_batch_size": train_bs,
            "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": cfg.top_k,
            "learning_rate": cfg.agent_learning_rate,
            "early_termination_threshold": cfg.early_termination_threshold,
            "advantage_normalization": cfg.advantage_normalization,
            "advantage_mode": cfg.advantage_mode,
            "discount": cfg.discount,
            "warmup_steps": warmup,
            "seed": seed,
        },
        "versions": {
            "python": platform.python_version(),
            "comlrl": dist_version("comlrl"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
            "datasets": dist_version("datasets"),
        },
        "torch_threads": torch.get_num_threads(),
        "executable": sys.executable,
        "spec": spec,
    }
    out_path.write_text(json.dumps(result, indent=2))
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "prompts_per_s",
                    "tokens_per_s",
                    "stage_s_per_step",
                    "reward_mean_by_turn",
                )
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
