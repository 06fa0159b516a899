"""Prompt formats: chat templates for instruct models, plain text for base models."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from comlrl.algos.models.chat_template import render_prompts, resolve_prompt_format
from comlrl.algos.models.loading import load_model_and_tokenizer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.core import SamplingParams
from comlrl.core.prompts import ChatPrompt

# A ChatML template (the form SmolLM2 and Qwen2 use); the tiny tokenizer has its tokens.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPT = ChatPrompt(
    (
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Write add(a, b)."},
    ),
    raw="def add(a, b):\n",
)


@pytest.fixture
def chat_tokenizer(tiny_tokenizer):  # type: ignore[no-untyped-def]
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = CHATML
    return tok


def test_auto_picks_chat_only_when_the_tokenizer_has_a_template(
    tiny_tokenizer, chat_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    assert resolve_prompt_format(tiny_tokenizer, "auto") == "raw"
    assert resolve_prompt_format(chat_tokenizer, "auto") == "chat"
    assert resolve_prompt_format(chat_tokenizer, "raw") == "raw"


def test_chat_without_a_template_and_unknown_formats_are_refused(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="no chat template"):
        resolve_prompt_format(tiny_tokenizer, "chat", name="agent 'a'")
    with pytest.raises(ValueError, match="unknown prompt_format 'jinja'"):
        resolve_prompt_format(tiny_tokenizer, "jinja")


def test_chat_renders_the_messages_with_the_generation_prompt(chat_tokenizer) -> None:  # type: ignore[no-untyped-def]
    (text,) = render_prompts(chat_tokenizer, [PROMPT], "chat")
    assert text == (
        "<|im_start|>system\nYou write Python.<|im_end|>\n"
        "<|im_start|>user\nWrite add(a, b).<|im_end|>\n<|im_start|>assistant\n"
    )
    # a plain string is one user message
    (plain,) = render_prompts(chat_tokenizer, ["hi"], "chat")
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_raw_feeds_the_base_model_text(chat_tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert render_prompts(chat_tokenizer, [PROMPT, "plain"], "raw") == ["def add(a, b):\n", "plain"]


def test_the_agent_samples_from_the_rendered_prompt_without_extra_special_tokens(
    tiny_model, chat_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    agent = HFAgent(tiny_model, chat_tokenizer, name="a")
    assert agent.prompt_format == "chat"
    agent.seed(0)
    samples = agent.sample([PROMPT], SamplingParams(num_generations=2, max_new_tokens=4))
    rendered = render_prompts(chat_tokenizer, [PROMPT], "chat")[0]
    assert samples.prompts == (rendered,)
    expected = chat_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    batch = samples.batch
    s = batch.prompt_length
    row = batch.input_ids[0, :s][batch.attention_mask[0, :s].bool()].tolist()
    assert row == expected

    raw_agent = HFAgent(tiny_model, chat_tokenizer, name="b", prompt_format="raw")
    raw = raw_agent.sample([PROMPT], SamplingParams(num_generations=1, max_new_tokens=2))
    assert raw.prompts == ("def add(a, b):\n",)


def test_a_file_that_is_not_gguf_is_named_as_such(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0")
    with pytest.raises(OSError, match="a file that is not a .gguf file"):
        load_model_and_tokenizer(str(f))


def test_a_gguf_model_without_the_gguf_package_fails_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from comlrl.algos.training.config.rl import ConfigError
    from comlrl.algos.training.config.task_setup import check_model_names

    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"GGUF file, which needs the `gguf` package"):
        check_model_names([str(f)])
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        # gguf counted as present (a spec), whether or not this venv has it
        lambda name, *a: (
            None if name == "accelerate" else real("json") if name == "gguf" else real(name, *a)
        ),
    )
    with pytest.raises(ConfigError, match=r"missing: accelerate\)"):
        check_model_names([str(f)])


def test_prompt_format_reaches_the_agents_from_the_config() -> None:
    from comlrl.algos.training.config.rl import build_config

    assert build_config({"prompt_format": "raw"}).generation_options()["prompt_format"] == "raw"
    with pytest.raises(Exception, match="prompt_format"):
        build_config({"prompt_format": "jinja"})
