"""OpenAIChat through the real openai SDK against a local server replaying wire answers."""

from __future__ import annotations

import socket
import subprocess
import sys
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
    ToolCall,
    ToolSpec,
    Usage,
)
from durable_agents.providers.openai_chat import OpenAIChat

from .wire import Reply, WireServer, fixture, reply

KEY = "sk-proj-test0123456789abcdefWq7Z"
# The arguments exactly as the fixture's model wrote them: spaces in one, none in the other.
ORDER_ARGS = '{"order_id": 1042, "include": ["shipping"]}'
WEATHER_ARGS = '{"city":"Zürich","unit":"celsius"}'
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
)


@pytest.fixture
def server() -> Iterator[WireServer]:
    s = WireServer().start()
    yield s
    s.stop()
    assert not s.unexpected, "the SDK sent more requests than the test queued"


@pytest.fixture
def model(server: WireServer) -> Iterator[OpenAIChat]:
    m = OpenAIChat("gpt-4.1-mini", api_key=KEY, base_url=f"{server.url}/v1", timeout=5.0)
    yield m
    m.close()


def ask(text: str = "Where is order 1042?", instructions: str = "You are support.") -> ModelRequest:
    return ModelRequest(instructions=instructions, messages=[Message(role="user", content=text)])


def test_importing_providers_imports_no_sdk() -> None:
    code = (
        "import sys, durable_agents.providers as p\n"
        "assert 'openai' not in sys.modules and 'anthropic' not in sys.modules\n"
        "assert p.OpenAIChat.__name__ == 'OpenAIChat'\n"
        "assert 'openai' in sys.modules and 'anthropic' not in sys.modules\n"
        "try:\n    p.Nope\nexcept AttributeError:\n    print('ok')\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_text_answer(server: WireServer, model: OpenAIChat) -> None:
    server.queue(reply("openai_chat_text"))
    response = model.generate(ask())

    assert response.message == Message(
        role="assistant", content="Order #1042 shipped on 12 June and should arrive by Friday."
    )
    assert response.finish == FINISH_STOP
    assert response.raw_finish == "stop"
    assert response.model == "gpt-4.1-mini-2025-04-14"
    assert model.model_id == "openai:gpt-4.1-mini"

    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body == {
        "model": "gpt-4.1-mini",
        "messages": [
            {"role": "system", "content": "You are support."},
            {"role": "user", "content": "Where is order 1042?"},
        ],
    }


def test_usage_splits_cached_tokens_out_of_prompt_tokens(
    server: WireServer, model: OpenAIChat
) -> None:
    server.queue(reply("openai_chat_text"))  # prompt 1342 of which 1024 cached, completion 27
    usage = model.generate(ask()).usage
    assert usage == Usage(input_tokens=318, output_tokens=27, cache_read_tokens=1024)
    assert usage.total_tokens == 1369


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (None, Usage()),
        ({"prompt_tokens": 26, "completion_tokens": 9, "total_tokens": 35}, Usage(26, 9)),
        (
            {
                "prompt_tokens": 40,
                "completion_tokens": 2,
                "total_tokens": 42,
                "prompt_tokens_details": {"cached_tokens": None},
            },
            Usage(40, 2),
        ),
    ],
)
def test_usage_when_details_or_usage_are_missing(
    server: WireServer, model: OpenAIChat, usage: object, expected: Usage
) -> None:
    server.queue(reply("openai_chat_text", usage=usage))
    assert model.generate(ask()).usage == expected


def test_no_system_message_without_instructions(server: WireServer, model: OpenAIChat) -> None:
    server.queue(reply("openai_chat_text"))
    model.generate(ask(instructions=""))
    assert [m["role"] for m in server.last_body["messages"]] == ["user"]


def test_several_tool_calls_in_one_turn(server: WireServer) -> None:
    model = OpenAIChat(
        "gpt-4.1-mini",
        api_key=KEY,
        base_url=f"{server.url}/v1",
        max_tokens=800,
        temperature=0.2,
        extra_body={"parallel_tool_calls": True},
    )
    server.queue(reply("openai_chat_tool_calls"))
    response = model.generate(ModelRequest("You are support.", [Message("user", "Hi")], [WEATHER]))
    model.close()

    # Whitespace and the unescaped "ü" survive: arguments are the model's text, not re-dumped.
    assert response.message.tool_calls == (
        ToolCall("call_Yx1aZ2bC3dE4fG5hI6jK7lM8", "get_order", ORDER_ARGS),
        ToolCall("call_Nn9oP0qR1sT2uV3wX4yZ5aB6", "get_weather", WEATHER_ARGS),
    )
    assert response.message.content == ""
    assert response.finish == FINISH_TOOL_CALLS
    assert response.raw_finish == "tool_calls"
    assert response.usage == Usage(input_tokens=412, output_tokens=58)

    body = server.last_body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": dict(WEATHER.parameters),
            },
        }
    ]
    assert body["max_completion_tokens"] == 800
    assert "max_tokens" not in body
    assert body["temperature"] == 0.2
    assert body["parallel_tool_calls"] is True


def test_round_trip_of_a_transcript_with_tool_results(
    server: WireServer, model: OpenAIChat
) -> None:
    server.queue(reply("openai_chat_tool_calls"), reply("openai_chat_text"))
    first = model.generate(ask())
    calls = first.message.tool_calls
    transcript = [
        Message("user", "Where is order 1042?"),
        first.message,
        Message("tool", '{"status":"shipped"}', tool_call_id=calls[0].id, name="get_order"),
        Message(
            "tool",
            '{"error":"weather service down"}',
            tool_call_id=calls[1].id,
            name="get_weather",
            is_error=True,
        ),
    ]
    second = model.generate(ModelRequest("You are support.", transcript))
    assert second.finish == FINISH_STOP

    assert server.last_body["messages"] == [
        {"role": "system", "content": "You are support."},
        {"role": "user", "content": "Where is order 1042?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_Yx1aZ2bC3dE4fG5hI6jK7lM8",
                    "type": "function",
                    "function": {
                        "name": "get_order",
                        "arguments": ORDER_ARGS,
                    },
                },
                {
                    "id": "call_Nn9oP0qR1sT2uV3wX4yZ5aB6",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": WEATHER_ARGS,
                    },
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_Yx1aZ2bC3dE4fG5hI6jK7lM8",
            "content": '{"status":"shipped"}',
        },
        {
            "role": "tool",
            "tool_call_id": "call_Nn9oP0qR1sT2uV3wX4yZ5aB6",
            "content": '{"error":"weather service down"}',
        },
    ]


def test_assistant_text_with_tool_calls_and_plain_assistant_text(
    server: WireServer, model: OpenAIChat
) -> None:
    server.queue(reply("openai_chat_text"))
    call = ToolCall("call_1", "get_weather", '{"city":"Oslo"}')
    transcript = [
        Message("user", "a"),
        Message("assistant", "Checking.", tool_calls=(call,)),
        Message("tool", "{}", tool_call_id="call_1"),
        Message("assistant", "It is sunny."),
        Message("user", "b"),
    ]
    model.generate(ModelRequest("", transcript))
    sent = server.last_body["messages"]
    assert sent[1]["content"] == "Checking."
    assert sent[3] == {"role": "assistant", "content": "It is sunny."}
    assert sent[4] == {"role": "user", "content": "b"}


@pytest.mark.parametrize(
    ("raw", "finish"),
    [
        ("stop", FINISH_STOP),
        ("tool_calls", FINISH_TOOL_CALLS),
        ("function_call", FINISH_TOOL_CALLS),
        ("length", FINISH_LENGTH),
        ("content_filter", FINISH_FILTERED),
        ("eos", FINISH_OTHER),  # what some compatible servers invent
    ],
)
def test_finish_reason_mapping(
    server: WireServer, model: OpenAIChat, raw: str, finish: str
) -> None:
    body = fixture("openai_chat_text")["body"]
    body["choices"][0]["finish_reason"] = raw
    server.queue(Reply(200, body))
    response = model.generate(ask())  # length and filtered are returned, never raised
    assert response.finish == finish
    assert response.raw_finish == raw
    assert response.usage.output_tokens == 27


def test_stop_on_a_tool_call_turn_counts_as_tool_calls(
    server: WireServer, model: OpenAIChat
) -> None:
    body = fixture("openai_chat_tool_calls")["body"]
    body["choices"][0]["finish_reason"] = "stop"
    server.queue(Reply(200, body))
    response = model.generate(ask())
    assert (response.finish, response.raw_finish) == (FINISH_TOOL_CALLS, "stop")


def test_refusal_is_filtered_not_an_answer(server: WireServer, model: OpenAIChat) -> None:
    body = fixture("openai_chat_text")["body"]
    body["choices"][0]["message"].update(content=None, refusal="I can't help with that.")
    server.queue(Reply(200, body))
    response = model.generate(ask())
    assert response.finish == FINISH_FILTERED
    assert response.raw_finish == "stop"
    assert response.message.content == "I can't help with that."


def test_no_choices_is_a_retryable_invalid_response(server: WireServer, model: OpenAIChat) -> None:
    server.queue(reply("openai_chat_text", choices=[]))
    with pytest.raises(ModelError) as info:
        model.generate(ask())
    assert (info.value.code, info.value.retryable) == ("model.invalid_response", True)


@pytest.mark.parametrize(
    ("name", "status", "code", "retryable"),
    [
        ("openai_error_429_rate_limit", 429, "model.rate_limited", True),
        ("openai_error_429_insufficient_quota", 429, "model.quota_exhausted", False),
        ("openai_error_500", 402, "model.quota_exhausted", False),  # OpenRouter-style 402
        ("openai_error_500", 500, "model.server_error", True),
        ("openai_error_500", 503, "model.server_error", True),
        ("openai_error_401", 401, "model.auth", False),
        ("openai_error_401", 403, "model.auth", False),
        ("openai_error_400", 400, "model.bad_request", False),
        ("openai_error_404", 404, "model.bad_request", False),
        ("openai_error_400", 422, "model.bad_request", False),
        ("openai_error_500", 408, "model.timeout", True),
    ],
)
def test_error_mapping(
    server: WireServer, model: OpenAIChat, name: str, status: int, code: str, retryable: bool
) -> None:
    answer = reply(name)
    answer.status = status
    server.queue(answer)
    with pytest.raises(ModelError) as info:
        model.generate(ask())
    err = info.value
    assert (err.code, err.retryable, err.status) == (code, retryable, status)
    assert err.details["provider"] == "openai"
    assert KEY not in err.message and "Wq7Z" not in err.message
    assert len(server.requests) == 1  # max_retries=0: the engine does the retrying


def test_error_messages_say_what_to_do(server: WireServer, model: OpenAIChat) -> None:
    server.queue(
        reply("openai_error_401"),
        reply("openai_error_429_rate_limit"),
        reply("openai_error_429_insufficient_quota"),
    )
    messages = []
    for _ in range(3):
        with pytest.raises(ModelError) as info:
            model.generate(ask())
        messages.append(info.value)
    auth, limited, quota = messages
    assert "OPENAI_API_KEY" in auth.message and "Incorrect API key provided" in auth.message
    assert "sk-proj-****" not in auth.message
    assert "retryable" in limited.message and limited.details["retry_after"] == 2.0
    assert limited.details["request_id"] == "req_a1b2c3d4e5f60718293a4b5c6d7e8f90"
    assert "credit" in quota.message and "will not help" in quota.message


def test_timeout_is_retryable(server: WireServer) -> None:
    model = OpenAIChat("gpt-4.1-mini", api_key=KEY, base_url=f"{server.url}/v1", timeout=0.2)
    server.queue(Reply(200, fixture("openai_chat_text")["body"], delay=1.0))
    with pytest.raises(ModelError) as info:
        model.generate(ask())
    model.close()
    assert (info.value.code, info.value.retryable) == ("model.timeout", True)
    assert "timeout=" in info.value.message


def test_connection_refused_is_retryable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIChat("gpt-4.1-mini", api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ModelError) as info:
        model.generate(ask())
    model.close()
    assert (info.value.code, info.value.retryable) == ("model.connection", True)
    assert f"127.0.0.1:{port}" in info.value.message


def test_any_openai_compatible_server_via_base_url(server: WireServer) -> None:
    model = OpenAIChat("llama3.1:8b", api_key="ollama", base_url=f"{server.url}/compat/v1")
    server.queue(reply("openai_compat_ollama"))
    response = model.generate(ask())
    model.close()
    assert server.requests[0].path == "/compat/v1/chat/completions"
    assert model.model_id == "openai:llama3.1:8b"
    assert response.message.content == "Order 1042 is on its way."
    assert response.usage == Usage(input_tokens=26, output_tokens=9)
    assert response.model == "llama3.1:8b"


def test_a_key_echoed_by_a_compatible_server_is_redacted(server: WireServer) -> None:
    secret = "vllm-token-0123456789"  # not shaped like an OpenAI key
    model = OpenAIChat("qwen3-8b", api_key=secret, base_url=f"{server.url}/v1")
    echo = fixture("openai_error_401")
    echo["body"]["error"]["message"] = f"Invalid token {secret} for this server"
    server.queue(Reply(401, echo["body"]))
    with pytest.raises(ModelError) as info:
        model.generate(ask())
    model.close()
    assert secret not in info.value.message
    assert "Invalid token [redacted] for this server" in info.value.message


def test_a_ready_client_is_used_without_sdk_retries(server: WireServer) -> None:
    import openai

    client = openai.OpenAI(api_key=KEY, base_url=f"{server.url}/v1", max_retries=5)
    model = OpenAIChat("gpt-4.1-mini", client=client)
    server.queue(reply("openai_error_500"), reply("openai_chat_text"))
    with pytest.raises(ModelError):
        model.generate(ask())
    assert model.generate(ask()).finish == FINISH_STOP
    client.close()
    assert len(server.requests) == 2


def test_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import openai

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIChat("gpt-4.1-mini")
    client = openai.OpenAI(api_key=KEY)
    with pytest.raises(ConfigError, match="either client"):
        OpenAIChat("gpt-4.1-mini", client=client, api_key=KEY)
    client.close()
    with pytest.raises(ConfigError):
        OpenAIChat("", api_key=KEY)
