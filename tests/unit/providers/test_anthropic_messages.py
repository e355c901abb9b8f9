"""AnthropicMessages via the real anthropic SDK against a local server replaying wire answers:
the adapter conformance suite (tests/support/adapter_conformance.py), then what only
Anthropic does."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anthropic
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
from durable_agents.providers.anthropic_messages import AnthropicMessages
from tests.support.adapter_conformance import WEATHER, AdapterConformance, ask
from tests.support.wire import Reply, WireServer, fixture, reply

KEY = "sk-ant-api03-test0123456789abcdef-Zx9"
THINKING = {"type": "enabled", "budget_tokens": 1024}
ORDER_CALL = "toolu_01A09q90qw90lq917835lq9"
WEATHER_CALL = "toolu_01B7c8d9e0f1a2b3c4d5e6f"


def fixture_blocks(name: str, *types: str) -> list[dict[str, object]]:
    return [b for b in fixture(name)["body"]["content"] if b["type"] in types]


class TestAnthropicMessages(AdapterConformance):
    adapter = AnthropicMessages
    sdk_client = anthropic.Anthropic
    model_name = "claude-sonnet-4-6"
    key = KEY
    key_env = "ANTHROPIC_API_KEY"
    provider = "anthropic"
    model_id = "anthropic:claude-sonnet-4-6"
    path = "/v1/messages"
    max_tokens_field = "max_tokens"

    text_reply = "anthropic_message_text"
    served_model = "claude-sonnet-4-6"
    raw_stop = "end_turn"
    text_usage = Usage(input_tokens=318, output_tokens=24, cache_read_tokens=2048)
    text_total_tokens = 318 + 24 + 2048
    text_request: ClassVar[dict[str, Any]] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 4096,
        "system": "You are support.",
        "messages": [{"role": "user", "content": "Where is order 1042?"}],
    }
    tool_calls_reply = "anthropic_message_thinking_tool_use"
    # input objects become compact JSON text, non-ASCII kept as is
    tool_calls = (
        ToolCall(ORDER_CALL, "get_order", '{"order_id":1042,"include":["shipping"]}'),
        ToolCall(WEATHER_CALL, "get_weather", '{"city":"Zürich","unit":"celsius"}'),
    )
    tool_turn_text = "Let me look up the order and the forecast."
    raw_tool_calls = "tool_use"
    tool_usage = Usage(
        input_tokens=57, output_tokens=221, cache_read_tokens=1800, cache_write_tokens=312
    )
    server_error_reply = "anthropic_error_529_overloaded"
    auth_reply = "anthropic_error_401"
    auth_said = "invalid x-api-key"
    rate_limit_reply = "anthropic_error_429_rate_limit"
    retry_after = 17.0
    quota_reply = "anthropic_error_402_billing"
    quota_error_type = "billing_error"

    finishes: ClassVar[list[tuple[str, str]]] = [
        ("end_turn", FINISH_STOP),
        ("stop_sequence", FINISH_STOP),
        ("tool_use", FINISH_TOOL_CALLS),
        ("max_tokens", FINISH_LENGTH),
        ("model_context_window_exceeded", FINISH_LENGTH),
        ("refusal", FINISH_FILTERED),
        ("pause_turn", FINISH_OTHER),
        ("a_reason_from_the_future", FINISH_OTHER),
    ]
    sparse_usages: ClassVar[list[tuple[Any, Usage]]] = [
        (
            {
                "input_tokens": 12,
                "output_tokens": 3,
                "cache_creation_input_tokens": None,
                "cache_read_input_tokens": None,
            },
            Usage(input_tokens=12, output_tokens=3),
        )
    ]
    errors: ClassVar[list[tuple[str, int, str, bool]]] = [
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
    ]

    def assert_credentials(self, headers: dict[str, str]) -> None:
        # anthropic 2.x sends the key as a Bearer token; earlier SDKs as x-api-key
        bearer = headers.get("authorization", "").removeprefix("Bearer ")
        assert KEY in (headers.get("x-api-key"), bearer)
        assert headers["anthropic-version"]

    def sends_instructions(self, body: dict[str, Any]) -> bool:
        return "system" in body

    def wire_tool(self, spec: ToolSpec) -> dict[str, Any]:
        return {
            "name": spec.name,
            "description": spec.description,
            "input_schema": dict(spec.parameters),
        }

    def finishing(self, raw: str) -> Reply:
        return reply(self.text_reply, stop_reason=raw)

    def round_trip_messages(self) -> list[dict[str, Any]]:
        # Thinking goes back unchanged, and the tool results merge into one user message.
        thinking, redacted = fixture_blocks(self.tool_calls_reply, "thinking", "redacted_thinking")
        assert thinking["signature"]  # the fixture carries one; it must survive verbatim
        return [
            {"role": "user", "content": "Where is order 1042?"},
            {
                "role": "assistant",
                "content": [
                    thinking,
                    redacted,
                    {"type": "text", "text": "Let me look up the order and the forecast."},
                    {
                        "type": "tool_use",
                        "id": ORDER_CALL,
                        "name": "get_order",
                        "input": {"order_id": 1042, "include": ["shipping"]},
                    },
                    {
                        "type": "tool_use",
                        "id": WEATHER_CALL,
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
                        "tool_use_id": ORDER_CALL,
                        "content": '{"status":"shipped"}',
                        "is_error": False,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": WEATHER_CALL,
                        "content": '{"error":"weather service down"}',
                        "is_error": True,
                    },
                ],
            },
        ]

    def clear_credentials(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv("ANTHROPIC_CONFIG_DIR", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))  # no profile on disk

    # -- Anthropic only

    def test_thinking_is_sent_and_comes_back_as_reasoning(self, server: WireServer) -> None:
        model = AnthropicMessages(
            "claude-sonnet-4-6",
            api_key=KEY,
            base_url=server.url,
            max_tokens=2048,
            thinking=THINKING,
        )
        server.queue(reply("anthropic_message_thinking_tool_use"))
        response = model.generate(
            ModelRequest("You are support.", [Message("user", "Hi")], [WEATHER])
        )
        model.close()

        assert list(response.message.reasoning) == fixture_blocks(
            "anthropic_message_thinking_tool_use", "thinking", "redacted_thinking"
        )
        body = server.last_body
        assert body["thinking"] == THINKING
        assert body["max_tokens"] == 2048
        assert "temperature" not in body

    def test_user_text_after_tool_results_joins_their_message(
        self, server: WireServer, model: AnthropicMessages
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

    def test_an_overloaded_api_says_so(self, server: WireServer, model: AnthropicMessages) -> None:
        server.queue(reply("anthropic_error_529_overloaded"))
        with pytest.raises(ModelError) as info:
            model.generate(ask())
        assert "Overloaded" in info.value.message

    def test_temperature_only_where_the_sdk_still_sends_it(self, server: WireServer) -> None:
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

    def test_a_profile_that_does_not_load_is_a_missing_key(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        self.clear_credentials(monkeypatch, tmp_path)
        monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # selects a missing profile
        with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
            AnthropicMessages("claude-sonnet-4-6")
