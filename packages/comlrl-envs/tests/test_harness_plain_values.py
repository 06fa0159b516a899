"""Values cross from the candidate's process to the tests as plain data, faithfully."""

from __future__ import annotations

from typing import Any

from comlrl.envs.code import HACK_SIGNALS, hack_signals
from comlrl.envs.sandbox import SandboxLimits, check_solution
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

LIMITS = SandboxLimits(timeout_s=10.0)
atoms = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
keys = st.integers() | st.text(max_size=4) | st.tuples(st.integers(), st.text(max_size=2))
values = st.recursive(
    atoms,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(keys, inner, max_size=4)
        | st.frozensets(st.integers(), max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(values)
def test_plain_values_reach_the_tests_equal_and_of_the_same_type(value: Any) -> None:
    literal = repr(value)
    program = f"def f():\n    return {literal}\n"
    test = (
        "def check(candidate):\n"
        f"    assert candidate() == {literal}\n"
        f"    assert type(candidate()) is type({literal})\n"
    )
    v = check_solution(program, test, "f", LIMITS)
    assert (v.status, v.passed) == ("passed", 2), (literal, v.errors)


@given(st.text(max_size=200))
def test_hack_signals_never_raises_and_names_known_signals(code: str) -> None:
    found = hack_signals(code)
    assert list(found) == sorted(set(found))
    assert set(found) <= set(HACK_SIGNALS)
