"""Arguments as a person reads them (durable_agents.admin.rendered): the schema's order and
titles, line breaks kept, numbers grouped except what names a thing, and folding that the
rendering always admits to (no decision is offered on a folded rendering)."""

from __future__ import annotations

from durable_agents.admin.rendered import LIST_FOLD, TEXT_FOLD, in_schema_order, render

SCHEMA = {
    "type": "object",
    "properties": {
        "payee": {"title": "Payee", "type": "string"},
        "amount_cents": {"type": "integer"},
        "order_id": {"type": "integer"},
        "memo": {"title": "Memo", "type": "string"},
        "lines": {"type": "array", "items": {"type": "string"}},
        "address": {"$ref": "#/$defs/Address"},
    },
    "$defs": {"Address": {"properties": {"city": {"title": "City"}}}},
}


def _flat(shown):
    return {f.key: f for f in shown.fields}


def test_fields_follow_the_schema_whatever_order_the_database_kept():
    # PostgreSQL's jsonb keeps shorter keys first: the memo would come before the payee.
    stored = {"memo": "hi", "extra": True, "payee": "ACME", "amount_cents": 1250000}
    shown = render(SCHEMA, stored)
    assert [f.key for f in shown.fields] == ["payee", "amount_cents", "memo", "extra"]
    assert [f.title for f in shown.fields] == ["Payee", "Amount cents", "Memo", "Extra"]
    assert list(in_schema_order(SCHEMA, stored)) == ["payee", "amount_cents", "memo", "extra"]
    fields = _flat(shown)
    assert fields["amount_cents"].node.text == "1,250,000"
    assert fields["extra"].node.text == "yes" and not shown.folded


def test_what_names_a_thing_keeps_its_digits():
    fields = _flat(render(SCHEMA, {"order_id": 1234567, "amount_cents": 1234567}))
    assert fields["order_id"].node.text == "1234567"
    assert fields["amount_cents"].node.text == "1,234,567"


def test_long_text_and_long_lists_fold_and_say_so_and_whole_shows_all():
    memo = "line one\nline two\n" + "x" * (TEXT_FOLD * 3)
    lines = [f"item {n}" for n in range(LIST_FOLD + 4)]
    folded = render(SCHEMA, {"memo": memo, "lines": lines})
    fields = _flat(folded)
    assert folded.folded
    assert fields["memo"].node.text.startswith("line one\nline two\n")  # breaks kept
    assert len(fields["memo"].node.text) == TEXT_FOLD
    assert fields["memo"].node.hidden_words == f"{len(memo) - TEXT_FOLD:,} more characters"
    assert len(fields["lines"].node.items) == LIST_FOLD
    assert fields["lines"].node.hidden_words == "4 more items"

    whole = render(SCHEMA, {"memo": memo, "lines": lines}, whole=True)
    fields = _flat(whole)
    assert not whole.folded and fields["memo"].node.text == memo
    assert [i.text for i in fields["lines"].node.items] == lines


def test_many_short_lines_fold_too():
    folded = render(SCHEMA, {"memo": "\n".join(f"l{n}" for n in range(20))})
    assert folded.folded and _flat(folded)["memo"].node.text.count("\n") == 7


def test_nested_objects_resolve_refs_and_odd_values_never_fail():
    shown = render(SCHEMA, {"address": {"city": "Bremen"}})
    [city] = _flat(shown)["address"].node.fields
    assert (city.title, city.node.text) == ("City", "Bremen")
    assert render(None, None).fields[0].node.kind == "none"
    assert render("not a schema", [1, 2]).fields[0].node.kind == "list"


def test_what_the_tool_names_as_identifying_comes_first_and_is_marked():
    # A memo first in the schema (and first in the database) that opens like the fields.
    schema = {"properties": {"memo": {"title": "Memo"}, **SCHEMA["properties"]}}
    stored = {"memo": "Payee: ACME Supplies GmbH\nAmount: 12,500.00 EUR", "payee": "Mallory"}
    stored["amount_cents"] = 1250000
    shown = render(schema, stored, first=("payee", "amount_cents"))
    assert [f.key for f in shown.fields] == ["payee", "amount_cents", "memo"]
    assert [f.identifying for f in shown.fields] == [True, True, False]
    order = in_schema_order(schema, stored, ("payee", "amount_cents"))
    assert list(order) == ["payee", "amount_cents", "memo"]
    # Without them: the schema's order, nothing marked; a name not in the call is skipped.
    plain = render(schema, stored, first=("not_there",))
    assert [f.key for f in plain.fields] == ["memo", "payee", "amount_cents"]
    assert not any(f.identifying for f in plain.fields)


def test_text_on_several_lines_or_long_is_free_text_and_says_how_long():
    fields = _flat(
        render(
            SCHEMA,
            {"payee": "ACME Supplies GmbH", "memo": "Payee: ACME\nAmount: 1", "lines": ["y" * 81]},
        )
    )
    assert not fields["payee"].node.free  # short, one line: a value, drawn quoted
    memo = fields["memo"].node
    assert memo.free and memo.length_words == "21 characters on 2 lines"
    assert fields["lines"].node.items[0].free  # longer than FREE_TEXT
    folded = _flat(render(SCHEMA, {"memo": "z" * (TEXT_FOLD * 2)}))["memo"].node
    assert folded.free and folded.length_words == f"{TEXT_FOLD * 2:,} characters"


def test_the_bulk_page_and_the_email_put_what_identifies_the_call_first():
    import durable_agents as da
    from durable_agents.admin.readable import fields_of

    def pay(memo: str, payee: str, amount_cents: int) -> dict:
        return {}

    tool = da.tool(requires_approval=True, identifying=["payee", "amount_cents"])(pay)
    stored = {"memo": "Payee: ACME", "amount_cents": 5, "payee": "Mallory"}
    assert [t for t, _ in fields_of(tool, stored)] == ["Payee", "Amount Cents", "Memo"]
    assert [t for t, _ in fields_of(da.tool(pay), stored)] == ["Memo", "Payee", "Amount Cents"]
