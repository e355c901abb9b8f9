"""What every model adapter promises the engine, checked on each provider's recorded wire
answers through its official SDK: tests/support/wire replays them over real HTTP, nothing
is mocked.

A provider's test module runs the suite by subclassing ``AdapterConformance`` in a class
named ``Test…`` and filling in what differs between providers: how the adapter and the SDK
client are built, which recorded answers to replay, and what the provider's wire format
and vocabulary look like. What only one provider does stays in that provider's module.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from durable_agents.engine.errors import ConfigError, ModelError
from durable_agents.engine.model import (
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ToolCall,
    ToolSpec,
    Usage,
)
from tests.support.wire import Reply, WireServer, fixture, reply

# The answer both recorded text replies carry.
ANSWER = "Order #1042 shipped on 12 June and should arrive by Friday."
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
)
# A compatible server's token: shaped like no provider's key, so only the adapter knowing
# it can keep it out of an error message.
FOREIGN_TOKEN = "vllm-token-0123456789"


def ask(text: str = "Where is order 1042?", instructions: str = "You are support.") -> ModelRequest:
    return ModelRequest(instructions=instructions, messages=[Message(role="user", content=text)])


def journaled(message: Message) -> Message:
    """What the engine does between turns: the assistant message goes through JSON."""
    return Message.from_json(json.loads(json.dumps(message.to_json())))


def leaks(secret: str, text: str) -> bool:
    """Whether ``text`` shows any ten characters of ``secret`` in a row."""
    return any(secret[i : i + 10] in text for i in range(len(secret) - 9))


def request_id(recorded: str) -> str:
    headers = fixture(recorded)["headers"]
    return str(headers.get("request-id") or headers["x-request-id"])


class AdapterConformance:
    """The shared tests; a subclass sets the attributes and methods below."""

    # -- the adapter and its SDK
    adapter: ClassVar[Callable[..., Any]]  # the adapter class
    sdk_client: ClassVar[Callable[..., Any]]  # the SDK's client class
    model_name: ClassVar[str]
    key: ClassVar[str]  # the API key tests build the adapter with
    key_env: ClassVar[str]  # the variable a missing key and a refused key name
    provider: ClassVar[str]  # ModelError.details["provider"]
    model_id: ClassVar[str]
    path: ClassVar[str]  # where the SDK posts a turn, below the server's root
    max_tokens_field: ClassVar[str]  # the body key ``max_tokens=`` is sent as

    # -- recorded answers (tests/support/wire) and what they mean to the engine
    text_reply: ClassVar[str]  # an answer in text: ANSWER
    served_model: ClassVar[str]  # its ``model``
    raw_stop: ClassVar[str]  # its finish reason, in the provider's words
    text_usage: ClassVar[Usage]
    text_total_tokens: ClassVar[int]
    text_request: ClassVar[dict[str, Any]]  # the body the SDK sends for ``ask()``
    tool_calls_reply: ClassVar[str]  # a turn of two tool calls (order, then weather)
    tool_calls: ClassVar[tuple[ToolCall, ...]]
    tool_turn_text: ClassVar[str]
    raw_tool_calls: ClassVar[str]
    tool_usage: ClassVar[Usage]
    server_error_reply: ClassVar[str]  # a retryable failure
    auth_reply: ClassVar[str]  # the key was refused
    auth_said: ClassVar[str]  # words of the provider's refusal the error keeps
    rate_limit_reply: ClassVar[str]
    retry_after: ClassVar[float]  # the rate limit's retry-after, in seconds
    quota_reply: ClassVar[str]  # out of credit
    quota_error_type: ClassVar[str]

    # -- tables the parametrised tests run through
    finishes: ClassVar[list[tuple[str, str]]]  # (provider's finish reason, engine's finish)
    sparse_usages: ClassVar[list[tuple[Any, Usage]]]  # usage bodies with parts missing
    errors: ClassVar[list[tuple[str, int, str, bool]]]  # (recorded, status, code, retryable)

    # -- the provider's wire format
    def base_url(self, root: str) -> str:
        """The adapter's ``base_url`` for a server at ``root``."""
        return root

    def assert_credentials(self, headers: dict[str, str]) -> None:
        raise NotImplementedError

    def sends_instructions(self, body: dict[str, Any]) -> bool:
        raise NotImplementedError

    def wire_tool(self, spec: ToolSpec) -> dict[str, Any]:
        raise NotImplementedError

    def finishing(self, raw: str) -> Reply:
        """The text reply, finishing for the reason ``raw``."""
        raise NotImplementedError

    def round_trip_messages(self) -> list[dict[str, Any]]:
        """The messages sent for: ask(), the tool-calls turn, its two results (the second an
        error)."""
        raise NotImplementedError

    def clear_credentials(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        """Leave the SDK no way to find a key."""
        raise NotImplementedError

    # -- the suite

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        tables = {
            ("raw", "finish"): self.finishes,
            ("usage", "expected"): self.sparse_usages,
            ("name", "status", "code", "retryable"): self.errors,
        }
        for names, cases in tables.items():
            if names[0] in metafunc.fixturenames:
                metafunc.parametrize(names, cases)

    def make(self, root: str, **options: Any) -> Any:
        options.setdefault("api_key", self.key)
        return self.adapter(self.model_name, base_url=self.base_url(root), **options)

    @pytest.fixture
    def server(self) -> Iterator[WireServer]:
        s = WireServer().start()
        yield s
        s.stop()
        assert not s.unexpected, "the SDK sent more requests than the test queued"

    @pytest.fixture
    def model(self, server: WireServer) -> Iterator[Any]:
        m = self.make(server.url, timeout=5.0)
        yield m
        m.close()

    def test_text_answer(self, server: WireServer, model: Any) -> None:
        server.queue(reply(self.text_reply))
        response = model.generate(ask())

        assert response.message == Message(role="assistant", content=ANSWER)
        assert (response.finish, response.raw_finish) == (FINISH_STOP, self.raw_stop)
        assert response.model == self.served_model
        assert model.model_id == self.model_id

        sent = server.requests[0]
        assert sent.path == self.path
        self.assert_credentials(sent.headers)
        assert sent.body == self.text_request

    def test_usage_counts_cached_tokens_apart(self, server: WireServer, model: Any) -> None:
        server.queue(reply(self.text_reply))
        usage = model.generate(ask()).usage
        assert usage == self.text_usage
        assert usage.total_tokens == self.text_total_tokens

    def test_usage_when_parts_are_missing(
        self, server: WireServer, model: Any, usage: Any, expected: Usage
    ) -> None:
        server.queue(reply(self.text_reply, usage=usage))
        assert model.generate(ask()).usage == expected

    def test_no_system_prompt_without_instructions(self, server: WireServer, model: Any) -> None:
        server.queue(reply(self.text_reply))
        model.generate(ask(instructions=""))
        assert not self.sends_instructions(server.last_body)
        assert server.last_body["messages"] == [{"role": "user", "content": "Where is order 1042?"}]

    def test_several_tool_calls_in_one_turn(self, server: WireServer) -> None:
        model = self.make(server.url, max_tokens=800)
        server.queue(reply(self.tool_calls_reply))
        response = model.generate(
            ModelRequest("You are support.", [Message("user", "Hi")], [WEATHER])
        )
        model.close()

        # Whitespace and the unescaped "ü" survive as the adapter received them.
        assert response.message.tool_calls == self.tool_calls
        assert response.message.content == self.tool_turn_text
        assert (response.finish, response.raw_finish) == (FINISH_TOOL_CALLS, self.raw_tool_calls)
        assert response.usage == self.tool_usage

        body = server.last_body
        assert body["tools"] == [self.wire_tool(WEATHER)]
        assert body[self.max_tokens_field] == 800

    def test_round_trip_of_a_transcript_with_tool_results(
        self, server: WireServer, model: Any
    ) -> None:
        server.queue(reply(self.tool_calls_reply), reply(self.text_reply))
        assistant = journaled(model.generate(ask()).message)
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
        second = model.generate(ModelRequest("You are support.", transcript))
        assert second.finish == FINISH_STOP
        assert server.last_body["messages"] == self.round_trip_messages()

    def test_finish_reason_mapping(
        self, server: WireServer, model: Any, raw: str, finish: str
    ) -> None:
        server.queue(self.finishing(raw))
        response = model.generate(ask())  # length and filtered are returned, never raised
        assert (response.finish, response.raw_finish) == (finish, raw)
        assert response.usage.output_tokens == self.text_usage.output_tokens

    def test_error_mapping(
        self, server: WireServer, model: Any, name: str, status: int, code: str, retryable: bool
    ) -> None:
        answer = reply(name)
        answer.status = status
        server.queue(answer)
        with pytest.raises(ModelError) as info:
            model.generate(ask())
        err = info.value
        assert (err.code, err.retryable, err.status) == (code, retryable, status)
        assert err.details["provider"] == self.provider
        assert err.details["request_id"] == request_id(name)
        # OpenAI echoes a refused key masked but for its last four characters.
        assert not leaks(self.key, err.message) and self.key[-4:] not in err.message
        assert len(server.requests) == 1  # max_retries=0: the engine does the retrying

    def test_error_messages_say_what_to_do(self, server: WireServer, model: Any) -> None:
        server.queue(reply(self.auth_reply), reply(self.rate_limit_reply), reply(self.quota_reply))
        errors = []
        for _ in range(3):
            with pytest.raises(ModelError) as info:
                model.generate(ask())
            errors.append(info.value)
        auth, limited, quota = errors
        assert self.key_env in auth.message and self.auth_said in auth.message
        assert "retryable" in limited.message and limited.details["retry_after"] == self.retry_after
        assert limited.details["request_id"] == request_id(self.rate_limit_reply)
        assert "credit" in quota.message and "will not help" in quota.message
        assert quota.details["error_type"] == self.quota_error_type

    def test_a_key_echoed_in_an_error_is_redacted(self, server: WireServer, model: Any) -> None:
        foreign = self.make(server.url, api_key=FOREIGN_TOKEN)
        for adapter, secret in ((model, self.key), (foreign, FOREIGN_TOKEN)):
            echo = fixture(self.auth_reply)
            echo["body"]["error"]["message"] = f"Invalid token {secret} for this server"
            server.queue(Reply(401, echo["body"]))
            with pytest.raises(ModelError) as info:
                adapter.generate(ask())
            assert not leaks(secret, info.value.message)
            assert "Invalid token [redacted] for this server" in info.value.message
        foreign.close()

    def test_timeout_is_retryable(self, server: WireServer) -> None:
        model = self.make(server.url, timeout=0.2)
        server.queue(Reply(200, fixture(self.text_reply)["body"], delay=1.0))
        with pytest.raises(ModelError) as info:
            model.generate(ask())
        model.close()
        assert (info.value.code, info.value.retryable) == ("model.timeout", True)
        assert "timeout=" in info.value.message

    def test_connection_refused_is_retryable(self) -> None:
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        model = self.make(f"http://127.0.0.1:{port}")
        with pytest.raises(ModelError) as info:
            model.generate(ask())
        model.close()
        assert (info.value.code, info.value.retryable) == ("model.connection", True)
        assert f"127.0.0.1:{port}" in info.value.message

    def test_a_ready_client_is_used_without_sdk_retries(self, server: WireServer) -> None:
        client = self.sdk_client(
            api_key=self.key, base_url=self.base_url(server.url), max_retries=5
        )
        model = self.adapter(self.model_name, client=client)
        server.queue(reply(self.server_error_reply), reply(self.text_reply))
        with pytest.raises(ModelError):
            model.generate(ask())
        assert model.generate(ask()).finish == FINISH_STOP
        client.close()
        assert len(server.requests) == 2

    def test_configuration_errors(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.clear_credentials(monkeypatch, tmp_path)
        with pytest.raises(ConfigError, match=self.key_env):
            self.adapter(self.model_name)
        client = self.sdk_client(api_key=self.key)
        for also in ({"api_key": self.key}, {"base_url": "http://x"}):
            with pytest.raises(ConfigError, match="either client"):
                self.adapter(self.model_name, client=client, **also)
        client.close()
        with pytest.raises(ConfigError):
            self.adapter("", api_key=self.key)
