"""Exit classification (docs/design.md §3.5): first matching rule, else preemption is free, else the shorthand."""

from __future__ import annotations

from typing import Any

import pytest

from elastic.policy.exits import Action, Decision, classify
from elastic.policy.incident import Failure
from elastic.spec import RestartPolicy, Rule, RuleAction

NEVER, ON_FAILURE, EXIT_CODE = RestartPolicy.NEVER, RestartPolicy.ON_FAILURE, RestartPolicy.EXIT_CODE
FAIL, RESTART, IGNORE = Action.FAIL_JOB, Action.RESTART_JOB, Action.IGNORE


def rule(action: str, codes: list[int] | None = None, op: str = "In", reasons: list[str] | None = None) -> Rule:
    data: dict[str, Any] = {"action": action}
    if codes is not None:
        data["onExitCodes"] = {"operator": op, "values": codes}
    if reasons is not None:
        data["onReasons"] = reasons
    return Rule.model_validate(data)


def code(exit_code: int | None, reason: str | None = None) -> Failure:
    return Failure(exit_code, reason)


CLASSIFY = [
    # The restartPolicy shorthand, no rules.
    pytest.param(code(1), [], ON_FAILURE, RESTART, None, id="1 with OnFailure shorthand restarts"),
    pytest.param(code(137), [], ON_FAILURE, RESTART, None, id="137 with OnFailure shorthand restarts"),
    pytest.param(code(1), [], NEVER, FAIL, None, id="1 with Never shorthand fails the job"),
    pytest.param(code(137), [], NEVER, FAIL, None, id="137 with Never shorthand fails the job"),
    pytest.param(code(1), [], EXIT_CODE, FAIL, None, id="1 with ExitCode shorthand fails the job"),
    pytest.param(code(127), [], EXIT_CODE, FAIL, None, id="127 with ExitCode shorthand fails the job"),
    pytest.param(code(128), [], EXIT_CODE, RESTART, None, id="128 with ExitCode shorthand restarts"),
    pytest.param(code(137), [], EXIT_CODE, RESTART, None, id="137 with ExitCode shorthand restarts"),
    pytest.param(code(-9), [], EXIT_CODE, RESTART, None, id="-9 from subprocess counts as 137 and restarts"),
    pytest.param(code(-15), [], NEVER, FAIL, None, id="-15 with Never shorthand still fails the job"),
    pytest.param(code(255), [], EXIT_CODE, RESTART, None, id="255 with ExitCode shorthand restarts"),
    pytest.param(code(1), [], "ExitCode", FAIL, None, id="the shorthand may be given as its string"),
    # Causes without an exit code.
    pytest.param(code(None, "NodeLost"), [], EXIT_CODE, RESTART, None, id="a lost node restarts under ExitCode"),
    pytest.param(code(None, "NodeLost"), [], NEVER, FAIL, None, id="a lost node fails the job under Never"),
    pytest.param(code(None), [], ON_FAILURE, RESTART, None, id="an unknown cause restarts under OnFailure"),
    pytest.param(
        code(None, "NodeLost"), [rule("FailJob", [1], "NotIn")], ON_FAILURE, RESTART, None,
        id="an exit-code rule never matches a cause without an exit code",
    ),
    # Preemption is free by default, under every shorthand.
    pytest.param(code(None, "Evicted"), [], NEVER, IGNORE, None, id="Evicted with no rule is ignored under Never"),
    pytest.param(code(143, "Preempted"), [], ON_FAILURE, IGNORE, None, id="Preempted with no rule is ignored"),
    pytest.param(
        code(137, "DisruptionTarget"), [], EXIT_CODE, IGNORE, None,
        id="DisruptionTarget with no rule is ignored under ExitCode",
    ),
    pytest.param(
        code(None, "Preempted"), [rule("RestartJob", reasons=["Preempted"])], ON_FAILURE, RESTART, 0,
        id="a rule can charge a preemption",
    ),
    pytest.param(
        code(143, "Evicted"), [rule("FailJob", [143])], ON_FAILURE, FAIL, 0,
        id="an exit-code rule matching an evicted worker wins over the free default",
    ),
    pytest.param(code(137, "OOMKilled"), [], NEVER, FAIL, None, id="OOMKilled is not a preemption"),
    # Rules, in order.
    pytest.param(code(1), [rule("FailJob", [1, 2])], ON_FAILURE, FAIL, 0, id="an In rule overrides OnFailure"),
    pytest.param(
        code(3), [rule("FailJob", [1, 2])], ON_FAILURE, RESTART, None, id="a non-matching In rule falls through"
    ),
    pytest.param(code(-9), [rule("Ignore", [137])], NEVER, IGNORE, 0, id="-9 matches a rule listing 137"),
    pytest.param(
        code(2), [rule("Ignore", [1]), rule("FailJob", [2]), rule("RestartJob", [2])], NEVER, FAIL, 1,
        id="the first matching rule wins over a later one",
    ),
    pytest.param(
        code(42), [rule("FailJob", [137, 143], "NotIn")], ON_FAILURE, FAIL, 0, id="NotIn matches an unlisted code"
    ),
    pytest.param(
        code(143), [rule("FailJob", [137, 143], "NotIn")], NEVER, FAIL, None,
        id="NotIn does not match a listed code, the shorthand decides",
    ),
    pytest.param(
        code(143), [rule("Ignore", [143]), rule("FailJob", [137, 143], "NotIn")], NEVER, IGNORE, 0,
        id="an Ignore rule on 143 makes SIGTERM free even under Never",
    ),
    pytest.param(
        code(137, "OOMKilled"), [rule("FailJob", reasons=["OOMKilled"])], ON_FAILURE, FAIL, 0,
        id="onReasons matches the reason",
    ),
    pytest.param(
        code(137), [rule("FailJob", reasons=["OOMKilled"])], ON_FAILURE, RESTART, None,
        id="onReasons does not match a cause without a reason",
    ),
    pytest.param(
        code(137, "OOMKilled"), [rule("FailJob", [1], reasons=["OOMKilled"])], ON_FAILURE, RESTART, None,
        id="with both conditions a right reason and a wrong code fall through",
    ),
    pytest.param(
        code(1, "Error"), [rule("FailJob", [1], reasons=["OOMKilled"])], ON_FAILURE, RESTART, None,
        id="with both conditions a right code and a wrong reason fall through",
    ),
    pytest.param(
        code(137, "OOMKilled"), [rule("Ignore", [1]), rule("FailJob", [137], reasons=["OOMKilled"])], ON_FAILURE,
        FAIL, 1, id="with both conditions matching the rule applies",
    ),
    # Exit codes that say the command cannot run: permanent under every shorthand, unless a rule names them.
    pytest.param(code(2), [], ON_FAILURE, FAIL, None, id="exit 2 (a script Python cannot open) fails the job"),
    pytest.param(code(127), [], ON_FAILURE, FAIL, None, id="exit 127 (command not found) fails the job"),
    pytest.param(code(126), [], EXIT_CODE, FAIL, None, id="exit 126 (not executable) fails the job"),
    pytest.param(code(2), [rule("RestartJob", [2])], ON_FAILURE, RESTART, 0, id="a rule naming exit 2 overrides"),
    pytest.param(code(2), [rule("Ignore", [1])], ON_FAILURE, FAIL, None, id="a rule for another code does not"),
    pytest.param(code(3), [], ON_FAILURE, RESTART, None, id="exit 3 is the program's own: OnFailure retries it"),
]  # fmt: skip


@pytest.mark.parametrize(("cause", "rules", "policy", "action", "index"), CLASSIFY)
def test_classify(
    cause: Failure, rules: list[Rule], policy: RestartPolicy | str, action: Action, index: int | None
) -> None:
    decision = classify(cause, rules, policy)
    assert (decision.action, decision.rule_index) == (action, index)


@pytest.mark.parametrize(
    ("cause", "rules", "policy", "expected"),
    [
        pytest.param(
            Failure(1, member="n0/3"), [rule("FailJob", [1])], ON_FAILURE,
            Decision(FAIL, 0, "exit code 1 of worker n0/3 matched failurePolicy.rules[0] (FailJob)"),
            id="a rule decision names the rule",
        ),
        pytest.param(
            Failure(-9, member="n1/0"), [], EXIT_CODE,
            Decision(
                RESTART, None,
                "exit code 137 (SIGKILL) of worker n1/0: no rule matched; "
                "restartPolicy ExitCode retries signal deaths (>= 128) and lost nodes",
            ),
            id="a shorthand decision names the signal and the shorthand",
        ),
        pytest.param(
            Failure(None, "Evicted"), [], NEVER,
            Decision(IGNORE, None, "Evicted is a preemption, free by default (no rule matched)"),
            id="a free preemption says why it is free",
        ),
    ],
)  # fmt: skip
def test_decisions_explain_themselves(
    cause: Failure, rules: list[Rule], policy: RestartPolicy, expected: Decision
) -> None:
    assert classify(cause, rules, policy) == expected


@pytest.mark.parametrize("policy", list(RestartPolicy), ids=lambda p: f"exit code 0 is refused under {p.value}")
def test_exit_code_zero_is_never_classified(policy: RestartPolicy) -> None:
    with pytest.raises(ValueError, match="exit code 0 is success"):
        classify(Failure(0), [], policy)


def test_actions_mirror_the_spec_rule_actions() -> None:
    assert [a.value for a in Action] == [a.value for a in RuleAction]
