"""OpenAIChat through the real openai SDK against a local server replaying wire answers: the
adapter conformance suite (tests/support/adapter_conformance.py), then what only OpenAI and
its compatible servers do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import openai
import pytest

from durable_agents.engine.errors import ModelError
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
from tests.support.adapter_conformance import WEATHER, AdapterConformance, ask
from tests.support.wire import Reply, WireServer, fixture, reply

KEY = "sk-proj-test0123456789abcdefWq7Z"
# The arguments exactly as the fixture's model wrote them: spaces in one, none in the other.
ORDER_ARGS = '{"order_id": 1042, "include": ["shipping"]}'
WEATHER_ARGS = '{"city":"Zürich","unit":"celsius"}'
ORDER_CALL = "call_Yx1aZ2bC3dE4fG5hI6jK7lM8"
WEATHER_CALL = "call_Nn9oP0qR1sT2uV3wX4yZ5aB6"


class TestOpenAIChat(AdapterConformance):
    adapter = OpenAIChat
    sdk_client = openai.OpenAI
    model_name = "gpt-4.1-mini"
    key = KEY
    key_env = "OPENAI_API_KEY"
    provider = "openai"
    model_id = "openai:gpt-4.1-mini"
    path = "/v1/chat/completions"
    max_tokens_field = "max_completion_tokens"

    text_reply = "openai_chat_text"
    served_model = "gpt-4.1-mini-2025-04-14"
    raw_stop = "stop"
    # prompt 1342 of which 1024 cached, completion 27
    text_usage = Usage(input_tokens=318, output_tokens=27, cache_read_tokens=1024)
    text_total_tokens = 1369
    text_request: ClassVar[dict[str, Any]] = {
        "model": "gpt-4.1-mini",
        "messages": [
            {"role": "system", "content": "You are support."},
            {"role": "user", "content": "Where is order 1042?"},
        ],
    }
    tool_calls_reply = "openai_chat_tool_calls"
    # Arguments are the model's text, not re-dumped.
    tool_calls = (
        ToolCall(ORDER_CALL, "get_order", ORDER_ARGS),
        ToolCall(WEATHER_CALL, "get_weather", WEATHER_ARGS),
    )
    tool_turn_text = ""
    raw_tool_calls = "tool_calls"
    tool_usage = Usage(input_tokens=412, output_tokens=58)
    server_error_reply = "openai_error_500"
    auth_reply = "openai_error_401"
    auth_said = "Incorrect API key provided"
    rate_limit_reply = "openai_error_429_rate_limit"
    retry_after = 2.0
    quota_reply = "openai_error_429_insufficient_quota"
    quota_error_type = "insufficient_quota"

    finishes: ClassVar[list[tuple[str, str]]] = [
        ("stop", FINISH_STOP),
        ("tool_calls", FINISH_TOOL_CALLS),
        ("function_call", FINISH_TOOL_CALLS),
        ("length", FINISH_LENGTH),
        ("content_filter", FINISH_FILTERED),
        ("eos", FINISH_OTHER),  # what some compatible servers invent
    ]
    sparse_usages: ClassVar[list[tuple[Any, Usage]]] = [
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
    ]
    errors: ClassVar[list[tuple[str, int, str, bool]]] = [
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
    ]

    def base_url(self, root: str) -> str:
        return f"{root}/v1"

    def assert_credentials(self, headers: dict[str, str]) -> None:
        assert headers["authorization"] == f"Bearer {KEY}"

    def sends_instructions(self, body: dict[str, Any]) -> bool:
        return any(m["role"] == "system" for m in body["messages"])

    def wire_tool(self, spec: ToolSpec) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            },
        }

    def finishing(self, raw: str) -> Reply:
        body = fixture(self.text_reply)["body"]
        body["choices"][0]["finish_reason"] = raw
        return Reply(200, body)

    def round_trip_messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "You are support."},
            {"role": "user", "content": "Where is order 1042?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": ORDER_CALL,
                        "type": "function",
                        "function": {"name": "get_order", "arguments": ORDER_ARGS},
                    },
                    {
                        "id": WEATHER_CALL,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": WEATHER_ARGS},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": ORDER_CALL, "content": '{"status":"shipped"}'},
            {
                "role": "tool",
                "tool_call_id": WEATHER_CALL,
                "content": '{"error":"weather service down"}',
            },
        ]

    def clear_credentials(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)

    # -- OpenAI and its compatible servers only

    def test_sampling_options_and_extra_body_reach_the_wire(self, server: WireServer) -> None:
        model = OpenAIChat(
            "gpt-4.1-mini",
            api_key=KEY,
            base_url=f"{server.url}/v1",
            max_tokens=800,
            temperature=0.2,
            extra_body={"parallel_tool_calls": True},
        )
        server.queue(reply("openai_chat_tool_calls"))
        model.generate(ModelRequest("You are support.", [Message("user", "Hi")], [WEATHER]))
        model.close()
        body = server.last_body
        assert body["max_completion_tokens"] == 800
        assert "max_tokens" not in body
        assert body["temperature"] == 0.2
        assert body["parallel_tool_calls"] is True

    def test_the_masked_key_openai_echoes_is_redacted(
        self, server: WireServer, model: OpenAIChat
    ) -> None:
        server.queue(reply("openai_error_401"))
        with pytest.raises(ModelError) as info:
            model.generate(ask())
        assert "Incorrect API key provided" in info.value.message
        assert "sk-proj-****" not in info.value.message

    def test_assistant_text_with_tool_calls_and_plain_assistant_text(
        self, server: WireServer, model: OpenAIChat
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

    def test_stop_on_a_tool_call_turn_counts_as_tool_calls(
        self, server: WireServer, model: OpenAIChat
    ) -> None:
        body = fixture("openai_chat_tool_calls")["body"]
        body["choices"][0]["finish_reason"] = "stop"
        server.queue(Reply(200, body))
        response = model.generate(ask())
        assert (response.finish, response.raw_finish) == (FINISH_TOOL_CALLS, "stop")

    def test_refusal_is_filtered_not_an_answer(self, server: WireServer, model: OpenAIChat) -> None:
        body = fixture("openai_chat_text")["body"]
        body["choices"][0]["message"].update(content=None, refusal="I can't help with that.")
        server.queue(Reply(200, body))
        response = model.generate(ask())
        assert response.finish == FINISH_FILTERED
        assert response.raw_finish == "stop"
        assert response.message.content == "I can't help with that."

    def test_no_choices_is_a_retryable_invalid_response(
        self, server: WireServer, model: OpenAIChat
    ) -> None:
        server.queue(reply("openai_chat_text", choices=[]))
        with pytest.raises(ModelError) as info:
            model.generate(ask())
        assert (info.value.code, info.value.retryable) == ("model.invalid_response", True)

    def test_any_openai_compatible_server_via_base_url(self, server: WireServer) -> None:
        model = OpenAIChat("llama3.1:8b", api_key="ollama", base_url=f"{server.url}/compat/v1")
        server.queue(reply("openai_compat_ollama"))
        response = model.generate(ask())
        model.close()
        assert server.requests[0].path == "/compat/v1/chat/completions"
        assert model.model_id == "openai:llama3.1:8b"
        assert response.message.content == "Order 1042 is on its way."
        assert response.usage == Usage(input_tokens=26, output_tokens=9)
        assert response.model == "llama3.1:8b"


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
