"""A real instruct LLM end to end: SmolLM2-135M-Instruct from its GGUF file, chat prompts, one
training step (``../shared/models/smollm2-135m-instruct``; skipped when absent)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2_gguf(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The GGUF file, with the GGUF cache (``COMLRL_GGUF_CACHE``) where the environment
    puts it (``nox`` shares one between its sessions) or in a folder of this module's: the
    first load converts the file, every later one reads the entry."""
    path = shared_dir / "models" / "smollm2-135m-instruct" / GGUF_NAME
    if not path.is_file():
        pytest.skip(f"SmolLM2-135M-Instruct GGUF not found at {path}")
    pytest.importorskip("gguf", reason="loading a GGUF file needs `pip install gguf`")
    from comlrl.algos.models.gguf import GGUF_CACHE_ENV

    with pytest.MonkeyPatch.context() as mp:
        if os.environ.get(GGUF_CACHE_ENV, "").strip().lower() in ("", "off", "0", "false", "no"):
            mp.setenv(GGUF_CACHE_ENV, str(tmp_path_factory.mktemp("gguf_cache")))
        yield path


def test_the_cached_conversion_is_the_gguf_files_model(smollm2_gguf: Path) -> None:
    """What a load reads from the GGUF cache is what transformers converts from the file:
    the same float32 weights bit for bit, config, generation config, vocabulary, special
    tokens, chat template and token ids (the entry is made here if it is not there yet)."""
    import torch
    from comlrl.algos.models import gguf
    from comlrl.algos.models.gguf import GGUF_CACHE_ENV, gguf_cache_entry
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.core import ChatPrompt

    entry = gguf_cache_entry(smollm2_gguf)
    assert entry is not None
    if (entry / "comlrl_gguf.json").is_file():  # made by an earlier run: convert afresh
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(GGUF_CACHE_ENV, "off")
            model, tok = load_model_and_tokenizer(str(smollm2_gguf))
    else:  # the first load converts the file, stores the entry and returns the conversion
        model, tok = load_model_and_tokenizer(str(smollm2_gguf))
    assert (entry / "comlrl_gguf.json").is_file() and (entry / "model.safetensors").is_file()
    with pytest.MonkeyPatch.context() as mp:  # the entry is read, the file not converted
        mp.setattr(gguf, "_convert", lambda *a: pytest.fail("converted the file again"))
        cached_model, cached_tok = load_model_and_tokenizer(str(smollm2_gguf))
    want, got = model.state_dict(), cached_model.state_dict()
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype == torch.float32, name
        assert torch.equal(got[name], tensor), name
    # what save_pretrained writes about the save itself (it names the class in architectures)
    skip = {"_name_or_path", "transformers_version", "architectures"}
    config = {k: v for k, v in model.config.to_dict().items() if k not in skip}
    assert {k: v for k, v in cached_model.config.to_dict().items() if k not in skip} == config
    assert cached_model.generation_config.to_dict() == model.generation_config.to_dict()
    assert cached_tok.get_vocab() == tok.get_vocab()
    assert cached_tok.chat_template == tok.chat_template is not None
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "padding_side"):
        assert getattr(cached_tok, attr) == getattr(tok, attr), attr
    from comlrl.algos.rollout.agent import HFAgent

    prompt = ChatPrompt([{"role": "user", "content": "Write add(a, b) in Python. Ünïcode ok?"}])
    texts = HFAgent(model, tok).render([prompt]) + ["def f(x):\n    return x ** 2  # 平方"]
    assert HFAgent(cached_model, cached_tok).render([prompt]) == texts[:1]
    for text in texts:
        assert cached_tok(text)["input_ids"] == tok(text)["input_ids"], text


def test_a_gguf_chat_model_trains_one_step_on_chat_prompts(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    from comlrl.algos.cli.main import main

    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--model",
            str(smollm2_gguf),
            "task.name=coop_humaneval",
            "num_steps=1",
            "batch_size=1",
            "num_generations=2",
            "max_new_tokens=16",
            "learning_rate=1e-6",
            "progress=false",
            f"output_dir={out}",
        ]
    )
    assert code == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 1
    sample = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    # the tokenizer's ChatML template was applied to the task's chat messages
    for prompt in sample["prompts"]:
        assert prompt.startswith("<|im_start|>system\n")
        assert prompt.endswith("<|im_start|>assistant\n")
    # checkpoints are plain save_pretrained folders (the GGUF quantization is gone)
    config = json.loads((out / "final" / "agent_0" / "config.json").read_text())
    assert "quantization_config" not in config
    assert (out / "final" / "agent_0" / "model.safetensors").is_file()


def test_fast_greedy_decode_on_the_cpu_gemv_kernel_matches_generate(smollm2_gguf: Path) -> None:
    """SmolLM2 decodes through comlrl.kernels' one-call C++ step (DecodeStep) by default,
    and through the Python step's C++ GEMV (FewRowsLinear) when that step is off: greedy
    tokens of chat prompts equal Hugging Face ``generate``'s either way, at 1 and 3 rows."""
    import torch
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.rollout.sampling.fast_decode import cpp_step as decode_native
    from comlrl.algos.rollout.sampling.fast_decode.decoder import FastDecoder
    from comlrl.algos.rollout.sampling.native import NativeSampler
    from comlrl.core import ChatPrompt, SamplingParams
    from comlrl.kernels import _dispatch, use_backend

    if _dispatch._cpu is None:
        pytest.skip(f"comlrl.kernels' _cpu module is not built ({_dispatch._CPU_ERROR})")
    model, tok = load_model_and_tokenizer(str(smollm2_gguf), seed=0, dtype="float32")
    texts = HFAgent(model, tok).render(
        [
            ChatPrompt([{"role": "user", "content": "Write a Python function add(a, b)."}]),
            ChatPrompt([{"role": "user", "content": "What is the capital of France?"}]),
            ChatPrompt([{"role": "user", "content": "Name three colours."}]),
        ]
    )
    real, calls = _dispatch._cpu, [0]

    class Counting:  # counts the kernel's calls
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            calls[0] += name == "linear_rows"
            return getattr(real, name)

    sampler = NativeSampler(model, pad_token_id=tok.pad_token_id, eos_token_ids=[])
    params = SamplingParams(num_generations=1, max_new_tokens=12, top_k=1)
    statuses: set[str] = set()
    real_step = FastDecoder.step

    def recording_step(self, tokens):  # type: ignore[no-untyped-def]
        statuses.add(self.native_status)
        return real_step(self, tokens)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_dispatch, "cpu_module", lambda: Counting())
        mp.setattr(FastDecoder, "step", recording_step)
        for batch in (texts[:1], texts):
            enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)
            ids, mask = enc["input_ids"], enc["attention_mask"]
            ours = sampler.sample(ids, mask, params)[0]
            with torch.no_grad():
                ref = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=12,
                    min_new_tokens=12,
                    pad_token_id=tok.pad_token_id,
                )[:, ids.shape[1] :]
            # generate's min_new_tokens bans EOS, so compare each row up to its first EOS
            eos = tok.convert_tokens_to_ids("<|im_end|>")
            for row, (a, b) in enumerate(zip(ours.tolist(), ref.tolist())):
                n = a.index(eos) if eos in a else len(a)
                assert n >= 6 and a[:n] == b[:n], (row, tok.decode(a), tok.decode(b))
            assert statuses == {"on"}  # the one-call C++ step served
            with use_backend("torch"):  # the Python step with F.linear: the same tokens
                assert torch.equal(sampler.sample(ids, mask, params)[0], ours)
            with pytest.MonkeyPatch.context() as off:  # the Python step with the GEMV
                off.setattr(decode_native, "decode_step_unavailable", lambda: "off here")
                calls[0] = 0
                assert torch.equal(sampler.sample(ids, mask, params)[0], ours)
                # 11 decode steps x (30 layers x 4 linears + the LM head), kernel runs only
                assert calls[0] == 11 * (30 * 4 + 1)
            statuses.clear()
    assert sampler.fast_decode_status == "on"


@pytest.mark.slow
def test_smollm2_calls_the_sandboxed_python_tool_through_its_chat_template(
    smollm2_gguf: Path,
) -> None:
    """tool_math's first test problem, greedy: SmolLM2 writes a fenced Python call, the
    sandbox runs it, the output comes back inside the ChatML turn, and the model answers;
    the first update's ratio is 1 with the observation inside the sequence."""
    import torch
    from comlrl.algos import HFAgent, load_model_and_tokenizer
    from comlrl.algos.rollout.environment import TaskEnvironment
    from comlrl.algos.rollout.tool_calls import sample_with_tools
    from comlrl.algos.training.update.policy import update_policy
    from comlrl.algos.training.update.settings import UpdateSettings
    from comlrl.core import SamplingParams, get_task

    task = get_task("tool_math", level="mul", num_train=4, num_eval=4)
    env = TaskEnvironment(task)
    example = task.load("test")[0]
    model, tokenizer = load_model_and_tokenizer(str(smollm2_gguf))
    agent = HFAgent(model, tokenizer, name="smollm2")
    assert agent.prompt_format == "chat"
    box = env.toolboxes[0]
    assert box is not None
    params = SamplingParams(num_generations=1, max_new_tokens=64, top_k=1)
    samples = sample_with_tools(agent, [task.prompts(example)[0]], params, box)
    env.close()
    prompt = samples.prompts[0]
    # the ChatML template rendered the task's messages, the python format's declaration in
    # the system message (SmolLM2's template has no tools of its own)
    assert prompt.startswith("<|im_start|>system\n") and "```python block" in prompt
    completion = samples.completions[0][0]
    assert completion.tool_results, completion.text
    first = completion.tool_results[0]
    assert first.call.name == "python" and first.error is None, first
    assert f"```output\n{first.content}\n```" in completion.transcript
    assert "```output" not in completion.text  # the reward reads the model's own text only
    batch = samples.batch
    observed = batch.attention_mask[:, batch.prompt_length :].bool() & ~batch.completion_mask
    assert int(observed.sum()) == first.result_tokens > 0
    settings = UpdateSettings(clip_ratio=0.2, max_completion_length=batch.completion_mask.shape[1])
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = update_policy(model, opt, [batch], [torch.tensor([1.0])], settings)
    # behaviour log-probs (segment by segment, KV-cached decode) against the update's one
    # forward over prompt, calls and observation: float32 round-off only
    assert abs(stats["ratio_mean"] - 1.0) < 1e-3, stats
