"""Approval rules as values (``engine.rules``): the first matching rule decides, its outcome
and the values that decided are explained, bad policies are a ``ConfigError`` where they are
written, and a condition that raises denies."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.rules import RuleContext, as_rules

CTX = RuleContext(agent="support", run_id="r1", tool="refund", requester="ann")

POLICY = da.Rules(
    [
        da.Rule("small", da.arg("amount_cents") <= 5_000, da.allow),
        da.Rule("too-big", da.arg("amount_cents") > 500_000, da.deny("Ask the customer to call.")),
        da.Rule("lead", da.arg("amount_cents") <= 100_000, da.ask("support-leads")),
    ],
    default=da.ask(da.Quorum(2, "finance"), requester_may_decide=False),
    deadline=da.Deadline(remind="4h", escalate=("24h", "oncall"), expire="3d"),
)


def test_the_first_matching_rule_decides_and_says_why():
    small = POLICY.evaluate({"amount_cents": 4_000}, CTX)
    assert (small.rule, small.outcome.kind, small.policy) == ("small", "allow", None)
    assert small.explain == "amount_cents 4000 <= 5000"
    big = POLICY.evaluate({"amount_cents": 600_000}, CTX)
    assert (big.rule, big.outcome.kind) == ("too-big", "deny")
    assert big.outcome.message == "Ask the customer to call."
    lead = POLICY.evaluate({"amount_cents": 50_000}, CTX)
    assert lead.rule == "lead" and lead.policy == {
        "kind": "single",
        "group": "support-leads",
        "deadline": {
            "remind": 14400.0,
            "escalate": 86400.0,
            "escalate_to": "oncall",
            "expire": 259200.0,
            "on_expiry": "deny",
        },
    }
    finance = POLICY.evaluate({"amount_cents": 125_000}, CTX)
    assert finance.rule == "default" and finance.explain == "no rule matched"
    assert finance.policy is not None
    assert (finance.policy["kind"], finance.policy["need"], finance.policy["group"]) == (
        "quorum",
        2,
        "finance",
    )
    assert finance.policy["separate"] is True
    assert finance.outcome.describe() == "2 of members of finance"
    assert len(POLICY.fingerprint) == 16 and finance.fingerprint == POLICY.fingerprint


def test_conditions_combine_and_read_nested_fields():
    rule = da.Rules(
        [
            da.Rule(
                "eu-and-small",
                (da.arg("address.country").is_in(["DE", "FR"])) & (da.arg("amount_cents") < 100),
                da.allow,
            ),
            da.Rule("by-function", lambda a, ctx: ctx.requester == "ann", da.ask()),
        ],
        default=da.deny("no"),
    )
    hit = rule.evaluate({"address": {"country": "DE"}, "amount_cents": 50}, CTX)
    assert hit.rule == "eu-and-small"
    assert hit.explain == '(address.country "DE" in ["DE","FR"] and amount_cents 50 < 100)'
    assert rule.evaluate({"amount_cents": 50}, CTX).rule == "by-function"
    other = RuleContext(agent="support", run_id="r1", tool="refund", requester="bob")
    assert rule.evaluate({"amount_cents": 50}, other).rule == "default"


def test_a_condition_that_raises_denies_naming_the_rule():
    def broken(arguments, context):
        raise KeyError("amount")

    match = da.Rules([da.Rule("broken", broken, da.allow)], default=da.allow).evaluate({}, CTX)
    assert (
        match.outcome.kind == "deny" and "'broken' could not be evaluated" in match.outcome.message
    )


def test_plain_gates_are_one_rule_policies():
    assert as_rules(None).evaluate({}, CTX).policy == {"kind": "single"}
    assert as_rules(da.Quorum(2, "ops")).evaluate({}, CTX).policy == {
        "kind": "quorum",
        "need": 2,
        "group": "ops",
    }


@pytest.mark.parametrize(
    "make",
    [
        lambda: da.Rules([], default=None),
        lambda: da.Rules([da.Rule("a", lambda a, c: True, da.allow)] * 2, default=da.allow),
        lambda: da.Rules([da.Rule("default", lambda a, c: True, da.allow)], default=da.allow),
        lambda: da.Rule("bad name!", lambda a, c: True, da.allow),
        lambda: da.Rule("x", 42, da.allow),
        lambda: da.Rule("x", lambda a, c: True, "allow"),
        lambda: da.deny(""),
        lambda: da.ask(42),
        lambda: da.Deadline(),
        lambda: da.Deadline(remind="3d", expire="4h"),
        lambda: da.Deadline(expire="soon"),
        lambda: da.Deadline(expire="1d", on_expiry="explode"),
        lambda: da.Deadline(escalate=("1h",)),
        lambda: da.tool(approval="yes")(lambda: None),
    ],
)
def test_a_bad_policy_is_a_config_error_where_it_is_written(make):
    with pytest.raises(da.ConfigError) as refused:
        make()
    assert refused.value.code in ("config.approval_rules", "config.tool_safety")


def test_deny_with_one_argument_is_an_outcome():
    outcome = da.deny("Ask the customer to call.")
    assert outcome.kind == "deny" and outcome.message == "Ask the customer to call."
