from __future__ import annotations

import ast

import pytest
from comlrl.envs.code.extract import (
    complete_function,
    has_nontrivial_body,
    keep_definitions,
    parse_prefix,
    strip_code_fences,
)
from comlrl.envs.code.humaneval import split_prompt


def test_strip_code_fences_keeps_python_blocks_only() -> None:
    text = "intro\n```python\nx = 1\n```\nthen\n```bash\nrm -rf /\n```\n```\ny = 2\n```"
    assert strip_code_fences(text) == "x = 1\n\ny = 2"
    assert strip_code_fences("no fences") == "no fences"
    assert strip_code_fences("```py\nz = 3\n") == "z = 3"  # unterminated (truncated)


def test_parse_prefix_trims_a_truncated_tail() -> None:
    parsed = parse_prefix("def f():\n    return 1\n\ndef g(:\n")
    assert parsed is not None
    source, module = parsed
    assert source.rstrip() == "def f():\n    return 1"
    assert [type(n).__name__ for n in module.body] == ["FunctionDef"]
    assert parse_prefix("(((") is None


def test_keep_definitions_drops_top_level_side_effects_and_named_defs() -> None:
    module = ast.parse(
        "from __future__ import annotations\nimport os\nX = 1\nprint('hi')\n"
        "def aux():\n    return 1\nmain = aux\nif __name__ == '__main__':\n    aux()\n"
    )
    kept = keep_definitions(module, {"main"})
    assert "print" not in kept and "__main__" not in kept and "__future__" not in kept
    assert "import os" in kept and "X = 1" in kept and "def aux" in kept
    assert "main = aux" not in kept


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ("def f():\n    pass", False),
        ('def f():\n    """doc"""', False),
        ("def f():\n    ...", False),
        ("def f():\n    return 1", True),
    ],
)
def test_has_nontrivial_body(src: str, expected: bool) -> None:
    func = ast.parse(src).body[0]
    assert has_nontrivial_body(func) is expected  # type: ignore[arg-type]


def test_complete_function_indents_and_cuts() -> None:
    prompt = 'def f(x):\n    """doc"""\n'
    assert complete_function(prompt, "return x\n") == prompt + "    return x\n"
    out = complete_function(prompt, "    return x\nprint(f(1)) garbage (\n")
    assert ast.parse(out) and "garbage" not in out


def test_split_prompt_separates_preamble_and_stub() -> None:
    prompt = 'import math\n\n\ndef g():\n    return 1\n\n\ndef f(x):\n    """doc"""\n'
    pre, stub = split_prompt(prompt, "f")
    assert pre.startswith("import math") and "def g" in pre and "def f" not in pre
    assert stub.startswith("def f(x):") and "doc" in stub
    assert split_prompt("not python (", "f") == ("", "not python (")
