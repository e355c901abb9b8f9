"""AnthropicMessages via the real anthropic SDK against a local server replaying wire answers."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agents.engine.errors import ConfigError, ModelError
from durable_agents.engine.model import (
    FINISH_FILTERED,
    FINISH_LENGTH,
    FINISH_OTHER,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)
from durable_agents.providers.anthropic_messages import AnthropicMessages

from .wire import Reply, WireServer, fixture, reply

KEY = "sk-ant-api03-test0123456789abcdef-Zx9"
THINKING = {"type": "enabled", "budget_tokens": 1024}
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


@pytest.fixture
def server() -> Iterator[WireServer]:
    s = WireServer().start()
    yield s
    s.stop()
    assert not s.unexpected, "the SDK sent more requests than the test queued"


@pytest.fixture
def model(server: WireServer) -> Iterator[AnthropicMessages]:
    m = AnthropicMessages("claude-sonnet-4-6", api_key=KEY, base_url=server.url, timeout=5.0)
    yield m
    m.close()


def ask(text: str = "Where is order 1042?", instructions: str = "You are support.") -> ModelRequest:
    return ModelRequest(instructions=instructions, messages=[Message(role="user", content=text)])


def fixture_blocks(name: str, *types: str) -> list[dict[str, object]]:
    return [b for b in fixture(name)["body"]["content"] if b["type"] in types]


def test_text_answer(server: WireServer, model: AnthropicMessages) -> None:
    server.queue(reply("anthropic_message_text"))
    response = model.generate(ask())

    assert response.message == Message(
        role="assistant", content="Order #1042 shipped on 12 June and should arrive by Friday."
    )
    assert (response.finish, response.raw_finish) == (FINISH_STOP, "end_turn")
    assert response.model == "claude-sonnet-4-6"
    assert response.usage == Usage(input_tokens=318, output_tokens=24, cache_read_tokens=2048)
    assert model.model_id == "anthropic:claude-sonnet-4-6"

    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    # anthropic 2.x sends the key as a Bearer token; earlier SDKs as x-api-key
    bearer = sent.headers.get("authorization", "").removeprefix("Bearer ")
    assert KEY in (sent.headers.get("x-api-key"), bearer)
    assert sent.headers["anthropic-version"]
    assert sent.body == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 4096,
        "system": "You are support.",
        "messages": [{"role": "user", "content": "Where is order 1042?"}],
    }


def test_no_system_without_instructions(server: WireServer, model: AnthropicMessages) -> None:
    server.queue(reply("anthropic_message_text"))
    model.generate(ask(instructions=""))
    assert "system" not in server.last_body


def test_thinking_and_several_tool_calls(server: WireServer) -> None:
    model = AnthropicMessages(
        "claude-sonnet-4-6",
        api_key=KEY,
        base_url=server.url,
        max_tokens=2048,
        thinking=THINKING,
    )
    server.queue(reply("anthropic_message_thinking_tool_use"))
    response = model.generate(ModelRequest("You are support.", [Message("user", "Hi")], [WEATHER]))
    model.close()

    assert response.message.content == "Let me look up the order and the forecast."
    # input objects become compact JSON text, non-ASCII kept as is
    assert response.message.tool_calls == (
        ToolCall(
            "toolu_01A09q90qw90lq917835lq9", "get_order", '{"order_id":1042,"include":["shipping"]}'
        ),
        ToolCall(
            "toolu_01B7c8d9e0f1a2b3c4d5e6f", "get_weather", '{"city":"Zürich","unit":"celsius"}'
        ),
    )
    assert list(response.message.reasoning) == fixture_blocks(
        "anthropic_message_thinking_tool_use", "thinking", "redacted_thinking"
    )
    assert (response.finish, response.raw_finish) == (FINISH_TOOL_CALLS, "tool_use")
    assert response.usage == Usage(
        input_tokens=57, output_tokens=221, cache_read_tokens=1800, cache_write_tokens=312
    )

    body = server.last_body
    assert body["thinking"] == THINKING
    assert body["max_tokens"] == 2048
    assert "temperature" not in body
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "input_schema": dict(WEATHER.parameters),
        }
    ]


def _journaled(response: ModelResponse) -> Message:
    # What the engine does between turns: the assistant message goes through JSON.
    return Message.from_json(json.loads(json.dumps(response.message.to_json())))


def test_round_trip_sends_thinking_back_unchanged_and_merges_tool_results(
    server: WireServer, model: AnthropicMessages
) -> None:
    server.queue(reply("anthropic_message_thinking_tool_use"), reply("anthropic_message_text"))
    assistant = _journaled(model.generate(ask()))
    order, weather = assistant.tool_calls
    transcript = [
        Message("user", "Where is order 1042?"),
        assistant,
        Message("tool", '{"status":"shipped"}', tool_call_id=order.id, name=order.name),
        Message(
            "tool",
            '{"error":"weather service down"}',
            tool_call_id=weather.id,
            name=weather.name,
            is_error=True,
        ),
    ]
    model.generate(ModelRequest("You are support.", transcript))

    thinking, redacted = fixture_blocks(
        "anthropic_message_thinking_tool_use", "thinking", "redacted_thinking"
    )
    assert thinking["signature"]  # the fixture carries one; it must survive verbatim
    assert server.last_body["messages"] == [
        {"role": "user", "content": "Where is order 1042?"},
        {
            "role": "assistant",
            "content": [
                thinking,
                redacted,
                {"type": "text", "text": "Let me look up the order and the forecast."},
                {
                    "type": "tool_use",
                    "id": "toolu_01A09q90qw90lq917835lq9",
                    "name": "get_order",
                    "input": {"order_id": 1042, "include": ["shipping"]},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_01B7c8d9e0f1a2b3c4d5e6f",
                    "name": "get_weather",
                    "input": {"city": "Zürich", "unit": "celsius"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                    "content": '{"status":"shipped"}',
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01B7c8d9e0f1a2b3c4d5e6f",
                    "content": '{"error":"weather service down"}',
                    "is_error": True,
                },
            ],
        },
    ]


def test_user_text_after_tool_results_joins_their_message(
    server: WireServer, model: AnthropicMessages
) -> None:
    server.queue(reply("anthropic_message_text"))
    transcript = [
        Message("user", "a"),
        Message("assistant", "", tool_calls=(ToolCall("toolu_1", "f", "not json"),)),
        Message("tool", "{}", tool_call_id="toolu_1"),
        Message("user", "and also b"),
        Message("assistant", "done"),
        Message("user", "c"),
    ]
    model.generate(ModelRequest("", transcript))
    assert server.last_body["messages"] == [
        {"role": "user", "content": "a"},
        # no empty text block; arguments that are not a JSON object are sent as {}
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "{}",
                    "is_error": False,
                },
                {"type": "text", "text": "and also b"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
        {"role": "user", "content": "c"},
    ]


@pytest.mark.parametrize(
    ("raw", "finish"),
    [
        ("end_turn", FINISH_STOP),
        ("stop_sequence", FINISH_STOP),
        ("tool_use", FINISH_TOOL_CALLS),
        ("max_tokens", FINISH_LENGTH),
        ("model_context_window_exceeded", FINISH_LENGTH),
        ("refusal", FINISH_FILTERED),
        ("pause_turn", FINISH_OTHER),
        ("a_reason_from_the_future", FINISH_OTHER),
    ],
)
def test_stop_reason_mapping(
    server: WireServer, model: AnthropicMessages, raw: str, finish: str
) -> None:
    server.queue(reply("anthropic_message_text", stop_reason=raw))
    response = model.generate(ask())  # length and filtered are returned, never raised
    assert (response.finish, response.raw_finish) == (finish, raw)
    assert response.usage.output_tokens == 24


def test_usage_with_null_cache_fields(server: WireServer, model: AnthropicMessages) -> None:
    usage = {
        "input_tokens": 12,
        "output_tokens": 3,
        "cache_creation_input_tokens": None,
        "cache_read_input_tokens": None,
    }
    server.queue(reply("anthropic_message_text", usage=usage))
    assert model.generate(ask()).usage == Usage(input_tokens=12, output_tokens=3)


@pytest.mark.parametrize(
    ("name", "status", "code", "retryable"),
    [
        ("anthropic_error_429_rate_limit", 429, "model.rate_limited", True),
        ("anthropic_error_529_overloaded", 529, "model.server_error", True),
        ("anthropic_error_500", 500, "model.server_error", True),
        ("anthropic_error_500", 504, "model.server_error", True),
        ("anthropic_error_401", 401, "model.auth", False),
        ("anthropic_error_401", 403, "model.auth", False),
        ("anthropic_error_400", 400, "model.bad_request", False),
        ("anthropic_error_400", 404, "model.bad_request", False),
        ("anthropic_error_400", 413, "model.bad_request", False),
        ("anthropic_error_402_billing", 402, "model.quota_exhausted", False),
        ("anthropic_error_402_billing", 400, "model.quota_exhausted", False),  # by error type
        ("anthropic_error_400_credit_balance", 400, "model.quota_exhausted", False),
    ],
)
def test_error_mapping(
    server: WireServer,
    model: AnthropicMessages,
    name: str,
    status: int,
    code: str,
    retryable: bool,
) -> None:
    answer = reply(name)
    answer.status = status
    server.queue(answer)
    with pytest.raises(ModelError) as info:
        model.generate(ask())
    err = info.value
    assert (err.code, err.retryable, err.status) == (code, retryable, status)
    assert err.details["provider"] == "anthropic"
    assert err.details["request_id"].startswith("req_")
    assert len(server.requests) == 1  # max_retries=0: the engine does the retrying


def test_error_messages_say_what_to_do_and_hide_the_key(
    server: WireServer, model: AnthropicMessages
) -> None:
    echo = fixture("anthropic_error_401")
    echo["body"]["error"]["message"] = f"invalid x-api-key {KEY}"
    server.queue(
        Reply(401, echo["body"]),
        reply("anthropic_error_429_rate_limit"),
        reply("anthropic_error_402_billing"),
        reply("anthropic_error_529_overloaded"),
    )
    errors = []
    for _ in range(4):
        with pytest.raises(ModelError) as info:
            model.generate(ask())
        errors.append(info.value)
    auth, limited, billing, overloaded = errors
    assert "ANTHROPIC_API_KEY" in auth.message and "invalid x-api-key" in auth.message
    assert all(KEY not in e.message and "test0123456789" not in e.message for e in errors)
    assert limited.details["retry_after"] == 17.0 and "retryable" in limited.message
    assert "credit" in billing.message and "will not help" in billing.message
    assert "Overloaded" in overloaded.message
    assert billing.details["error_type"] == "billing_error"


def test_timeout_is_retryable(server: WireServer) -> None:
    model = AnthropicMessages("claude-sonnet-4-6", api_key=KEY, base_url=server.url, timeout=0.2)
    server.queue(Reply(200, fixture("anthropic_message_text")["body"], delay=1.0))
    with pytest.raises(ModelError) as info:
        model.generate(ask())
    model.close()
    assert (info.value.code, info.value.retryable) == ("model.timeout", True)


def test_connection_refused_is_retryable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = AnthropicMessages("claude-sonnet-4-6", api_key=KEY, base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(ModelError) as info:
        model.generate(ask())
    model.close()
    assert (info.value.code, info.value.retryable) == ("model.connection", True)


def test_a_ready_client_is_used_without_sdk_retries(server: WireServer) -> None:
    import anthropic

    client = anthropic.Anthropic(api_key=KEY, base_url=server.url, max_retries=5)
    model = AnthropicMessages("claude-sonnet-4-6", client=client)
    server.queue(reply("anthropic_error_529_overloaded"), reply("anthropic_message_text"))
    with pytest.raises(ModelError):
        model.generate(ask())
    assert model.generate(ask()).finish == FINISH_STOP
    client.close()
    assert len(server.requests) == 2


def test_temperature_only_where_the_sdk_still_sends_it(server: WireServer) -> None:
    from durable_agents.providers.anthropic_messages import _sdk_takes

    if not _sdk_takes("temperature"):  # anthropic >= 2: the API rejects sampling parameters
        with pytest.raises(ConfigError, match="temperature"):
            AnthropicMessages("claude-sonnet-4-6", api_key=KEY, temperature=0.2)
        return
    model = AnthropicMessages(
        "claude-sonnet-4-6", api_key=KEY, base_url=server.url, temperature=0.2
    )
    server.queue(reply("anthropic_message_text"))
    model.generate(ask())
    model.close()
    assert server.last_body["temperature"] == 0.2


def test_configuration_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import anthropic

    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ANTHROPIC_CONFIG_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no profile on disk
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicMessages("claude-sonnet-4-6")
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # selects a missing profile
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicMessages("claude-sonnet-4-6")

    client = anthropic.Anthropic(api_key=KEY)
    with pytest.raises(ConfigError, match="either client"):
        AnthropicMessages("claude-sonnet-4-6", client=client, base_url="http://x")
    client.close()
    with pytest.raises(ConfigError):
        AnthropicMessages("", api_key=KEY)
