from __future__ import annotations

import pytest
from comlrl.core import Completion, Feedback, JointAction, SamplingParams


def test_joint_action_needs_one_completion_per_index() -> None:
    with pytest.raises(ValueError, match="2 indices but 1 completions"):
        JointAction(indices=(0, 1), completions=("a",))


def test_joint_action_counts_agents() -> None:
    assert JointAction(indices=(2, 0, 1), completions=("a", "b", "c")).num_agents == 3


def test_completion_counts_tokens() -> None:
    assert Completion("hi", token_ids=[5, 6, 7]).num_tokens == 3
    assert Completion("hi").num_tokens == 0


def test_feedback_defaults_to_not_done() -> None:
    fb = Feedback(texts=("x", "y"))
    assert fb.done is False and dict(fb.info) == {}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_generations": 0}, "num_generations must be >= 1, got 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ({"temperature": 0.0}, "temperature must be > 0, got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_k": -1}, "top_k must be >= 0"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_from_a_config_take_its_four_settings_and_the_group_size() -> None:
    from types import SimpleNamespace

    cfg = SimpleNamespace(max_new_tokens="24", temperature=0.7, top_p=0.9, top_k=None)
    assert SamplingParams.from_config(cfg, 3) == SamplingParams(3, 24, 0.7, 0.9, 0)
    assert SamplingParams.from_config(cfg, 2, max_new_tokens=8).max_new_tokens == 8
    with pytest.raises(ValueError, match="temperature must be > 0, got 0.0"):
        SamplingParams.from_config(SimpleNamespace(**{**vars(cfg), "temperature": 0}), 1)
    with pytest.raises(AttributeError, match="top_p"):
        SamplingParams.from_config(SimpleNamespace(max_new_tokens=4, temperature=1.0), 1)
