"""CoMLRL 1.4.3's iterative preference trainers with ``collaboration_mode="centralized"``:
one joint actor, its rounds against a comparator of joint responses (a local HTTP
comparator here), replay shards on disk, and MARLHFIter's fresh reward model per round."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.trainers.preference import (
    MADPOIterConfig,
    MADPOIterTrainer,
    MARLHFIterConfig,
    MARLHFIterTrainer,
)

WORDS = ["<pad>", "<eos>", "<unk>", "yes", "no", "maybe", "task", "first", "second"]
ROWS = [{"prompt": "task"} for _ in range(2)]
FORMATTERS = [lambda ex: "first " + ex["prompt"], lambda ex: "second " + ex["prompt"]]
SAMPLING = dict(
    collaboration_mode="centralized", agent_devices="cpu", max_new_tokens=4, temperature=1.0,
    top_p=1.0, top_k=None, eval_interval=0, agent_learning_rate=1e-2,
    preference_num_candidates=3, preference_pairs_per_sample=2, num_iterations=2,
    train_batch_size=2, rollout_buffer_size=2,
)  # fmt: skip


def _tokenizer() -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _model(tokenizer: Any, seed: int = 0) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.eos_token_id,
        )
    )  # fmt: skip


class _Halves:
    """Role 0 writes the first half of the joint response's words, role 1 the rest."""

    def build_prompt(self, item: dict[str, Any], agent_prompts: list[str]) -> str:
        return " ".join(agent_prompts)

    def parse_completion(self, completion: str, item: dict[str, Any], num_agents: int) -> list[str]:
        words = completion.split()
        half = (len(words) + 1) // 2
        return [" ".join(words[:half]), " ".join(words[half:])]


def _yes_count(first: list[str], second: list[str]) -> list[float]:
    return [float(first[0].split().count("yes") + second[0].split().count("yes"))]


class _Comparator(BaseHTTPRequestHandler):
    """Answers every prompt with all-``yes`` joint responses (reward 4)."""

    prompts: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).prompts.append(body["prompt"])
        n = int(body["num_return_sequences"])
        reply = json.dumps({"completions": ["yes yes yes yes"] * n}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def comparator_url() -> Iterator[str]:
    _Comparator.prompts = []
    httpd = HTTPServer(("127.0.0.1", 0), _Comparator)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/generate"
    finally:
        httpd.shutdown()
        thread.join()


def test_centralized_madpo_iter_learns_from_an_http_comparator_and_writes_replay_shards(
    comparator_url: str, tmp_path: Path
) -> None:
    tok = _tokenizer()
    trainer = MADPOIterTrainer(
        agents=[_model(tok)],
        tokenizer=tok,
        train_dataset=ROWS,
        reward_func=_yes_count,
        formatters=FORMATTERS,
        centralized_comparator_adapter=_Halves(),
        args=MADPOIterConfig(
            comparator_policy="api", comparator_api_url=comparator_url,
            preference_replay_dir=str(tmp_path / "replay"), preference_replay_mode="all_history",
            **SAMPLING,
        ),
    )  # fmt: skip
    assert (trainer.num_agents, trainer.args.comparator_generation_mode) == (1, "centralized")
    before = {k: v.clone() for k, v in trainer.agents[0].state_dict().items()}
    rows = trainer.train()
    # the comparator was asked with the joint prompt, 3 joint responses per prompt per round
    assert _Comparator.prompts == ["first task second task"] * 4
    assert rows and all("loss/agent_0" in r and "loss/agent_1" not in r for r in rows)
    assert any(not torch.equal(before[k], v) for k, v in trainer.agents[0].state_dict().items())
    for round_number in (1, 2):
        shard = json.loads((tmp_path / "replay" / f"iteration_{round_number:04d}.json").read_text())
        assert shard["num_pairs"] == len(shard["pairs"]) > 0
        for pair in shard["pairs"]:
            # the API's all-yes joint response (reward 4) wins unless the actor tied it
            assert pair["chosen"] == ["yes yes yes yes"] and pair["chosen_source"] == "comparator"
            assert pair["chosen_reward"] == 4.0 > pair["rejected_reward"]
            assert pair["prompts"] == ["first task second task"]
            assert pair["chosen_ids"][0][-1] == tok.eos_token_id
    assert [r["iter/current_preference_pairs"] for r in trainer.round_history] == [4.0, 4.0]


def test_centralized_marlhf_iter_fits_a_fresh_reward_model_each_round(tmp_path: Path) -> None:
    tok = _tokenizer()
    _model(tok, seed=1).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    trainer = MARLHFIterTrainer(
        agents=[_model(tok)],
        tokenizer=tok,
        train_dataset=ROWS,
        reward_func=_yes_count,
        formatters=FORMATTERS,
        centralized_comparator_adapter=_Halves(),
        args=MARLHFIterConfig(
            reward_model_name=str(tmp_path / "rm"), reward_model_device="cpu",
            reward_num_train_epochs=1, num_generations=2, num_train_epochs=1,
            **{**SAMPLING, "preference_num_candidates": 6, "temperature": 2.0},
        ),
    )  # fmt: skip
    assert trainer.reward_model is None  # built when training starts, as 1.4.3
    built: list[Any] = []
    hook = trainer._init_reward_model

    def counting_hook() -> None:
        hook()
        built.append(trainer.reward_model)

    trainer._init_reward_model = counting_hook  # type: ignore[method-assign]
    rows = trainer.train()
    rounds_with_pairs = sum(r["iter/train_preference_pairs"] > 0 for r in trainer.round_history)
    assert rounds_with_pairs >= 1 and len(built) == rounds_with_pairs
    assert len({id(m) for m in built}) == len(built)  # a new model each round
    assert rows and all(r["iteration"] in (1.0, 2.0) for r in rows)
    # the RL stage counts the joint actions it scored: 2 prompts x 2 generations per step
    assert trainer.env_step == sum(int(r["num_joint_actions"]) for r in rows) == 4 * len(rows)
