from __future__ import annotations

import ast

import pytest
from comlrl.envs.code.extract import (
    code_blocks,
    complete_function,
    has_nontrivial_body,
    keep_definitions,
    parse_code,
    parse_prefix,
    strip_code_fences,
)
from comlrl.envs.code.humaneval_data import split_prompt
from hypothesis import given
from hypothesis import strategies as st


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


CHAT_ANSWER = '''Sure! Here is the helper function:

```python
import math
from typing import List

def aux(numbers: List[float]) -> float:
    """Smallest gap."""
    s = sorted(numbers)
    return min(b - a for a, b in zip(s, s[1:]))

print(aux([1.0, 2.5]))
result = aux([3.0, 1.0])
```

You can use it like this:

```python
assert aux([1.0, 2.0]) == 1.0
if __name__ == "__main__":
    print(aux([0.5, 0.7]))
```

```text
1.5
```
This function sorts the list first.'''


def test_code_blocks_of_a_chat_answer() -> None:
    blocks = code_blocks(CHAT_ANSWER)
    assert len(blocks) == 2 and blocks[0].startswith("import math")
    assert "1.5\n" not in "".join(blocks)  # the ```text block is skipped
    # no fences: prose before the first definition is dropped
    assert code_blocks("Here it is.\ndef f():\n    return 1\n") == ["def f():\n    return 1\n"]
    assert code_blocks("    return x") == ["    return x"]  # a raw body stays as it is
    # an indented fenced block is dedented
    assert code_blocks("```\n    def f():\n        return 1\n```") == ["def f():\n    return 1\n"]


def test_parse_code_keeps_definitions_and_drops_examples_and_tests() -> None:
    module = parse_code(CHAT_ANSWER)
    assert module is not None
    kept = keep_definitions(module)
    assert "import math" in kept and "from typing import List" in kept
    assert "def aux(numbers: List[float]) -> float:" in kept
    for dropped in ("print(", "result =", "assert", "__main__"):
        assert dropped not in kept
    assert ast.parse(kept)


def test_parse_code_survives_a_broken_block_and_a_truncated_tail() -> None:
    text = (
        "```python\ndef f(x):\n    return x +\n```\n"
        "```python\ndef g(y):\n    return y\n\ndef h(z):\n    return [z,\n"
    )
    module = parse_code(text)
    assert module is not None
    names = [n.name for n in module.body if isinstance(n, ast.FunctionDef)]
    assert names == ["g"]  # f's block and h's truncated definition are cut
    assert parse_code("no code at all (") is None


def test_prose_around_unfenced_code_is_trimmed() -> None:
    module = parse_code("def f(x):\n    return 2 * x\n\nThis doubles x. It is fast.\n")
    assert module is not None and keep_definitions(module) == "def f(x):\n    return 2 * x"
    # a prose line that looks like code ("import ... into") is skipped
    text = "import this function into your module:\n\ndef g():\n    return 1\n"
    module = parse_code(text)
    assert module is not None and keep_definitions(module) == "def g():\n    return 1"


def test_keep_definitions_drops_tests_and_example_runs_but_keeps_constants() -> None:
    module = ast.parse(
        "import re\nPATTERN = re.compile('a+')\nLIMIT = 10\n"
        "def aux(x):\n    return x\n"
        "def test_aux():\n    assert aux(1) == 1\n"
        "class TestAux(unittest.TestCase):\n    def test_one(self):\n        pass\n"
        "value: int = aux(2)\nout = [aux(i) for i in range(3)]\n"
    )
    kept = keep_definitions(module)
    assert "PATTERN = re.compile" in kept and "LIMIT = 10" in kept and "def aux" in kept
    for dropped in ("test_aux", "TestAux", "value", "out ="):
        assert dropped not in kept


_SNIPPETS = st.sampled_from(
    [
        "def aux(x):\n    return x + 1\n",
        "print(aux(3))\n",
        "import math\n",
        "Here is the code.\n",
        "```python\n",
        "```\n",
        "if __name__ == '__main__':\n    aux(1)\n",
        "assert aux(1) == 2\n",
        "def test_it():\n    assert True\n",
        "    return [x,\n",
    ]
)


@given(st.lists(_SNIPPETS, max_size=8))
def test_extracted_code_always_parses_and_runs_nothing_at_import(parts: list[str]) -> None:
    module = parse_code("".join(parts))
    if module is None:
        return
    kept = keep_definitions(module)
    tree = ast.parse(kept)  # what is kept always parses
    for node in tree.body:
        assert isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Assign))
        assert not (isinstance(node, ast.FunctionDef) and node.name.startswith("test"))
