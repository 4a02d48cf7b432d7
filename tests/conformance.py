"""What each provider family refuses, as its documentation (and its maintainers' threads, where
the documentation is silent) says; tests/fake_provider.py applies it to every request it
receives. A refusal carries the service's own status code and error body.

Sources, per rule (looked up for these fakes; docs/ai.md's provider table repeats them):

OpenAI chat completions (https://platform.openai.com/docs/api-reference/chat/create)
- a function name "Must be a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum
  length of 64"; 400 `Invalid 'tools[0].function.name': string does not match pattern ...`
  (the API reference's `function.name`; openai/openai-python and portkey's error library
  quote the body, error #10046).
- "A max of 128 functions are supported" (the reference's `tools`); 400 array_above_max_length.
- every `tool` message answers a `tool_call_id` of the immediately preceding assistant message:
  400 "Invalid parameter: messages with role 'tool' must be a response to a preceeding message
  with 'tool_calls'." (param messages.[N].role); and each call of that message is answered
  before anything else: 400 "An assistant message with 'tool_calls' must be followed by tool
  messages responding to each 'tool_call_id'. The following tool_call_ids did not have response
  messages: …" (FoundationAgents/OpenManus#23, langchain-ai/task_mAIstro#1, BerriAI/litellm#10083).
- unknown fields: at the top level 400 "Unrecognized request argument supplied: X"
  (coroot/coroot#698 for reasoning_effort, CherryHQ/cherry-studio#6155 for enable_thinking);
  in a message 400 "Additional properties are not allowed ('X' was unexpected) - 'messages.N'"
  (transitive-bullshit/agentic#531, openai/openai-node#1161). So `reasoning_content` is
  never to be sent to OpenAI.
- reasoning models (o-series, gpt-5 family) refuse `max_tokens`: 400 "Unsupported parameter:
  'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
  (param max_tokens, code unsupported_parameter; teilomillet/gollm#33, microsoft/clarity-agent#59).
- `content` may be null only on an assistant message with `tool_calls` (the reference's
  assistant message: "Required unless tool_calls or function_call is specified").

DeepSeek (https://api-docs.deepseek.com/guides/thinking_mode)
- the OpenAI name rules and the same tool-message order errors (qwersyk/Newelle#425, with
  DeepSeek's own API).
- thinking mode (deepseek-reasoner, or `thinking: {type: enabled}` in the request): "For turns
  that do perform tool calls, the reasoning_content must be fully passed back to the API in all
  subsequent requests ... the API will return a 400 error"; between two user messages, when the
  model called tools, its reasoning_content 在后续所有 user 交互轮次中必须回传给 API (the
  guide's Chinese page: must be passed back in every later user turn): refused wherever it
  stands, with 400 "Missing `reasoning_content` field in the assistant message at message index
  N. For more information, please refer to
  https://api-docs.deepseek.com/guides/thinking_mode#tool-calls" (deepseek-reasoner:
  abhigyanpatwari/GitNexus#43, continuedev/continue#9831 and #9940; the V4 models word it "The
  `reasoning_content` in the thinking mode must be passed back to the API.", decolua/9router#773,
  langchain-ai/langchain#37713).
- reasoning_content of an earlier turn that called no tool is ignored (在后续轮次中将其传入 API
  会被忽略: passed in later turns, it is ignored; the same page), so it is accepted here. The older reasoning model
  guide of deepseek-reasoner (guides/reasoning_model, from before it could call tools) said "if
  the reasoning_content field is included in the sequence of input messages, the API will return
  a 400 error"; no thread or page quotes the body of that 400 (searched: the status code and the
  behaviour are all that is known), and the current guide replaces the rule, so no fake
  refuses it.
- deepseek-chat is the non-thinking mode of the same model (the Models & Pricing page,
  https://api-docs.deepseek.com/quick_start/pricing, MODEL VERSION row: deepseek-chat
  "DeepSeek-V3.x (Non-thinking Mode)", deepseek-reasoner "(Thinking Mode)", the version moving
  with releases): its replies carry no reasoning_content and nothing needs passing back, unless
  the request turns thinking on (`thinking: {type: enabled}`, the thinking mode guide).

Qwen / DashScope compatible mode (https://help.aliyun.com/zh/model-studio/deep-thinking)
- Qwen3 models (hybrid thinking) refuse a non-streaming call unless thinking is off: 400
  {"error": {"code": "invalid_parameter_error", "message": "parameter.enable_thinking must be
  set to false for non-streaming calls", "type": "invalid_request_error"}, "request_id": …}
  (langchain4j/langchain4j#3974, OpenBMB/UltraRAG#287, QuantumNous/new-api#1109).
- tool order: 400 `<400> InternalError.Algo.InvalidParameter: messages with role "tool" must be
  a response to a preceeding message with "tool_calls".` (philschmid/mcp-openai-gemini-llama-example#5,
  QwenLM/qwen-code#606).

Gemini, OpenAI-compatible endpoint (https://ai.google.dev/gemini-api/docs/openai)
- errors come as a JSON list: [{"error": {"code": 400, "message": …, "status":
  "INVALID_ARGUMENT"}}] (google-gemini/gemini-cli#4701, pydantic/pydantic-ai#1879).
- a function name "Must start with a letter or an underscore. Must be a-z, A-Z, 0-9, or contain
  underscores, dots, colons and dashes, with a maximum length of 64" (FunctionDeclaration).
- a tool message whose id answers no call: "GenerateContentRequest.contents[N].parts[0].
  function_response.name: Name cannot be empty." (pydantic/pydantic-ai#1879); calls and
  responses one to one: "Please ensure that the number of function response parts is equal to
  the number of function call parts of the function call turn." (microsoft/vscode#299295).
- an empty text part: "Unable to submit request because it has an empty text parameter."
  (langroid/langroid#821); an unknown field: 'Invalid JSON payload received. Unknown name "X":
  Cannot find field.' (gera2ld/ai.nvim#13).
- replies: tool calls with an empty `id` (vercel/ai#7834, camel-ai/camel#3027).

Ollama /v1 (https://docs.ollama.com/api/openai-compatibility)
- the supported request fields are listed (model, messages, tools, max_tokens, …); others are
  ignored. A model without tool support: 400 "registry.ollama.ai/library/X does not support
  tools" (the tool-support blog post: models under the Tools category).
- the context: the OpenAI API has no field for it and Ollama truncates a longer prompt to
  num_ctx silently, without an error (ollama/ollama#5902, #4447, #2722): `truncated` records it.

llama.cpp server (tools/server/README.md)
- tools need the server started with --jinja: 500 {"error": {"code": 500, "message": "tools
  param requires --jinja flag", "type": "server_error"}} (containers/ramalama#988,
  defilantech/LLMKube#126).
- a prompt beyond the slot's context: 400 {"error": {"code": 400, "message": "request (N tokens)
  exceeds the available context size (M tokens), try increasing it", "type":
  "exceed_context_size_error", "n_prompt_tokens": N, "n_ctx": M}} (ggml-org/llama.cpp#15780,
  #19774).

vLLM (https://docs.vllm.ai/en/latest/features/tool_calling/)
- `tool_choice: auto` needs the server started with --enable-auto-tool-choice and
  --tool-call-parser: 400 "\"auto\" tool choice requires --enable-auto-tool-choice and
  --tool-call-parser to be set" (soapbucket/sbproxy#591, the NVIDIA forum thread on vLLM 400s).
- errors are a top-level object: {"object": "error", "message": …, "type": "BadRequestError",
  "param": null, "code": 400} (vllm-project/vllm#4667); the context: 400 "This model's maximum
  context length is M tokens. However, you requested N tokens (P in the messages, C in the
  completion). Please reduce the length of the messages or completion." (vllm-project/vllm#20409).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

FAMILIES = ("openai", "deepseek", "qwen", "gemini", "ollama", "llamacpp", "vllm")
# A model of each family that exercises its rules: OpenAI's is a reasoning model (no max_tokens),
# DeepSeek's thinks (reasoning_content), Qwen's is a Qwen3 (thinking off for non-streaming calls).
MODELS = {
    "openai": "gpt-5-mini", "deepseek": "deepseek-reasoner", "qwen": "qwen3-32b", "gemini": "gemini-2.5-flash",
    "ollama": "qwen2.5:7b", "llamacpp": "qwen2.5-7b-instruct-q4_k_m", "vllm": "Qwen/Qwen2.5-7B-Instruct",
}
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
GEMINI_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]*$")
OPENAI_TOP = frozenset({
    "model", "messages", "tools", "tool_choice", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
    "top_logprobs", "user", "seed", "response_format", "parallel_tool_calls", "reasoning_effort", "metadata",
    "store", "service_tier", "modalities", "prediction", "audio", "web_search_options", "verbosity",
    "prompt_cache_key", "safety_identifier", "functions", "function_call",
})
OPENAI_MESSAGE = {
    "system": {"role", "content", "name"}, "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"},
    "tool": {"role", "content", "tool_call_id"},
}
REASONING = re.compile(r"^(o\d|gpt-5)")


@dataclass
class Refusal:
    status: int
    body: Any
    why: str  # for the test's message: what the request did wrong


def tokens(raw: bytes) -> int:
    """What a tokenizer makes of a request, roughly: four bytes a token."""
    return len(raw) // 4


def _openai_error(message: str, param: str | None = None, code: str | None = None) -> Refusal:
    return Refusal(400, {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": code}}, message)


class Family:
    """OpenAI chat completions' request rules; each family below overrides what differs."""

    name = "openai"
    strict_fields = True  # unknown fields refused (OpenAI); the others ignore them
    name_pattern: re.Pattern[str] | None = OPENAI_NAME
    max_tools: int | None = 128

    def __init__(self, model: str, **flags: Any) -> None:
        self.model = model
        self.flags = flags

    # -- replies -------------------------------------------------------------------------

    def shape(self, reply: Any, request: dict[str, Any]) -> Any:
        """A scripted reply as this family sends it."""
        return reply

    # -- refusals ------------------------------------------------------------------------

    def error(self, message: str, param: str | None = None, code: str | None = None) -> Refusal:
        return _openai_error(message, param, code)

    def refuse(self, body: Any, raw: bytes) -> Refusal | None:
        if not isinstance(body, dict):
            return self.error("We could not parse the JSON body of your request.")
        if self.strict_fields:
            for key in body:
                if key not in OPENAI_TOP:
                    return self.error(f"Unrecognized request argument supplied: {key}")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return self.error("you must provide a model parameter")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self.error("[] is too short - 'messages'", "messages")
        found = self.tools(body.get("tools"))
        return found or self.messages(messages) or self.thinking(body) or self.limits(body, raw)

    def tools(self, tools: Any) -> Refusal | None:
        if tools is None:
            return None
        if not isinstance(tools, list):
            return self.error("Invalid type for 'tools': expected an array", "tools")
        if self.max_tools is not None and len(tools) > self.max_tools:
            return self.error(f"Invalid 'tools': array too long. Expected an array with maximum length"
                              f" {self.max_tools}, but got an array with length {len(tools)} instead.", "tools",
                              "array_above_max_length")
        for i, entry in enumerate(tools):
            function = entry.get("function") if isinstance(entry, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str) or entry.get("type") != "function":
                return self.error(f"Missing required parameter: 'tools[{i}].function.name'.", f"tools[{i}]")
            refused = self.function_name(name, f"tools[{i}].function.name")
            if refused is not None:
                return refused
        return None

    def function_name(self, name: str, where: str) -> Refusal | None:
        if self.name_pattern is None:
            return None
        if len(name) > 64:
            return self.error(f"Invalid '{where}': string too long. Expected a string with maximum length 64, but"
                              f" got a string with length {len(name)} instead.", where, "string_above_max_length")
        if not self.name_pattern.match(name):
            return self.error(f"Invalid '{where}': string does not match pattern. Expected a string that matches the"
                              f" pattern '{self.name_pattern.pattern}'.", where, "invalid_value")
        return None

    def message_fields(self, role: str) -> set[str] | None:
        return OPENAI_MESSAGE.get(role) if self.strict_fields else None

    def messages(self, messages: list[Any]) -> Refusal | None:
        pending: list[str] = []  # calls of the last assistant message not yet answered
        calls: set[str] = set()  # ... and all of its calls
        in_answers = False  # the messages since that assistant message are all tool messages
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in OPENAI_MESSAGE:
                return self.error(f"Invalid value: '{m.get('role') if isinstance(m, dict) else m}'. Supported values"
                                  " are: 'system', 'assistant', 'user', 'tool', 'function', and 'developer'.",
                                  f"messages[{i}].role", "invalid_value")
            role = m["role"]
            allowed = self.message_fields(role)
            if allowed is not None:
                extra = sorted(set(m) - allowed)
                if extra:
                    return self.error(f"Additional properties are not allowed ('{extra[0]}' was unexpected) -"
                                      f" 'messages.{i}'")
            refused = self.content(i, m)
            if refused is not None:
                return refused
            if role == "tool":
                if not in_answers:
                    return self.tool_without_call(i)
                if m.get("tool_call_id") not in calls:
                    return self.unknown_call(i, m.get("tool_call_id"))
                if m["tool_call_id"] in pending:
                    pending.remove(m["tool_call_id"])
                continue
            if pending:
                return self.unanswered(i, pending)
            in_answers, calls = False, set()
            if role == "assistant" and m.get("tool_calls"):
                refused = self.calls(i, m["tool_calls"])
                if refused is not None:
                    return refused
                calls = {c["id"] for c in m["tool_calls"]}
                pending = [c["id"] for c in m["tool_calls"]]
                in_answers = True
        if pending:
            return self.unanswered(len(messages), pending)
        return None

    def content(self, i: int, m: dict[str, Any]) -> Refusal | None:
        if "content" not in m and not (m["role"] == "assistant" and m.get("tool_calls")):
            return self.error(f"Missing required parameter: 'messages[{i}].content'.", f"messages[{i}].content")
        if m.get("content") is None and "content" in m and not (m["role"] == "assistant" and m.get("tool_calls")):
            return self.error("Invalid value for 'content': expected a string, got null.",
                              f"messages.[{i}].content")
        return None

    def calls(self, i: int, tool_calls: Any) -> Refusal | None:
        for j, call in enumerate(tool_calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(call.get("id"), str) or not call["id"]:
                return self.error(f"Missing required parameter: 'messages[{i}].tool_calls[{j}].id'.")
            if not isinstance(function.get("arguments"), str):
                return self.error(f"Invalid type for 'messages[{i}].tool_calls[{j}].function.arguments': expected a"
                                  " string, but got an object instead.")
            refused = self.function_name(function.get("name") or "", f"messages[{i}].tool_calls[{j}].function.name")
            if refused is not None:
                return refused
        return None

    def tool_without_call(self, i: int) -> Refusal:
        return self.error("Invalid parameter: messages with role 'tool' must be a response to a preceeding message"
                          " with 'tool_calls'.", f"messages.[{i}].role")

    def unknown_call(self, i: int, call_id: Any) -> Refusal:
        return self.error(f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of previous"
                          " message.", f"messages.[{i}].tool_call_id")

    def unanswered(self, i: int, pending: list[str]) -> Refusal:
        return self.error("An assistant message with 'tool_calls' must be followed by tool messages responding to"
                          " each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                          + ", ".join(pending), f"messages.[{i}].role")

    def thinking(self, body: dict[str, Any]) -> Refusal | None:
        return None

    def limits(self, body: dict[str, Any], raw: bytes) -> Refusal | None:
        if REASONING.match(body["model"]) and "max_tokens" in body:
            return self.error("Unsupported parameter: 'max_tokens' is not supported with this model. Use"
                              " 'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")
        return None


class DeepSeek(Family):
    name = "deepseek"
    strict_fields = False  # the OpenAI format; unknown fields are not refused

    def thinks(self, request: dict[str, Any]) -> bool:
        """Thinking mode: deepseek-reasoner, or any model asked for it (deepseek-chat is not)."""
        asked = request.get("thinking")
        if isinstance(asked, dict) and asked.get("type") in ("enabled", "disabled"):
            return asked["type"] == "enabled"
        return request.get("model", self.model) == "deepseek-reasoner"

    def shape(self, reply: Any, request: dict[str, Any]) -> Any:
        if isinstance(reply, dict):
            for choice in reply.get("choices", []):
                message = choice.get("message") or {}
                if self.thinks(request):
                    message.setdefault("reasoning_content", "The owner asks about a run; I check the records first.")
                else:  # non-thinking mode: there is no reasoning to send
                    message.pop("reasoning_content", None)
        return reply

    def message_fields(self, role: str) -> set[str] | None:
        return None

    def thinking(self, body: dict[str, Any]) -> Refusal | None:
        if not self.thinks(body):
            return None
        for i, m in enumerate(body["messages"]):  # every tool-calling turn, the earlier user turns' too
            if m["role"] == "assistant" and m.get("tool_calls") and "reasoning_content" not in m:
                return self.error(f"Missing `reasoning_content` field in the assistant message at message index {i}."
                                  " For more information, please refer to"
                                  " https://api-docs.deepseek.com/guides/thinking_mode#tool-calls")
        return None  # an earlier turn's reasoning without tool calls is ignored, not refused

    def limits(self, body: dict[str, Any], raw: bytes) -> Refusal | None:
        return None


class Qwen(Family):
    name = "qwen"
    strict_fields = False
    name_pattern = None  # DashScope documents no pattern of its own

    def error(self, message: str, param: str | None = None, code: str | None = None) -> Refusal:
        rid = str(uuid.uuid4())
        return Refusal(400, {"error": {"code": code or "invalid_parameter_error", "param": param, "message": message,
                                       "type": "invalid_request_error"}, "id": f"chatcmpl-{rid}",
                             "request_id": rid}, message)

    def message_fields(self, role: str) -> set[str] | None:
        return None

    def tool_without_call(self, i: int) -> Refusal:
        return self.error('<400> InternalError.Algo.InvalidParameter: messages with role "tool" must be a response'
                          ' to a preceeding message with "tool_calls".')

    def unanswered(self, i: int, pending: list[str]) -> Refusal:
        return self.error('<400> InternalError.Algo.InvalidParameter: An assistant message with "tool_calls" must'
                          ' be followed by tool messages responding to each "tool_call_id". The following'
                          f' tool_call_ids did not have response messages: message[{i}].role')

    def limits(self, body: dict[str, Any], raw: bytes) -> Refusal | None:
        if body["model"].startswith("qwen3") and not body.get("stream") and body.get("enable_thinking") is not False:
            return self.error("parameter.enable_thinking must be set to false for non-streaming calls")
        return None


class Gemini(Family):
    name = "gemini"
    strict_fields = True
    name_pattern = GEMINI_NAME

    def error(self, message: str, param: str | None = None, code: str | None = None) -> Refusal:
        return Refusal(400, [{"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}], message)

    def refuse(self, body: Any, raw: bytes) -> Refusal | None:
        if isinstance(body, dict):
            for key in body:
                if key not in OPENAI_TOP:
                    return self.error(f'Invalid JSON payload received. Unknown name "{key}": Cannot find field.')
        return super().refuse(body, raw)

    def message_fields(self, role: str) -> set[str] | None:
        fields = OPENAI_MESSAGE.get(role)
        return None if fields is None else fields | {"extra_content"}

    def shape(self, reply: Any, request: dict[str, Any]) -> Any:
        if isinstance(reply, dict) and self.flags.get("empty_ids", True):
            for choice in reply.get("choices", []):
                for call in (choice.get("message") or {}).get("tool_calls") or []:
                    call["id"] = ""  # what the endpoint sends
        return reply

    def content(self, i: int, m: dict[str, Any]) -> Refusal | None:
        if m.get("content") == "":
            return self.error("Unable to submit request because it has an empty text parameter. Add a value to the"
                              " parameter and try again.")
        return super().content(i, m)

    def unknown_call(self, i: int, call_id: Any) -> Refusal:
        return self.error(f"* GenerateContentRequest.contents[{i}].parts[0].function_response.name: Name cannot be"
                          " empty.\n")

    def tool_without_call(self, i: int) -> Refusal:
        return self.unknown_call(i, None)

    def unanswered(self, i: int, pending: list[str]) -> Refusal:
        return self.error("Please ensure that the number of function response parts is equal to the number of"
                          " function call parts of the function call turn.")

    def limits(self, body: dict[str, Any], raw: bytes) -> Refusal | None:
        return None


class Ollama(Family):
    name = "ollama"
    strict_fields = False
    name_pattern = None
    max_tools = None

    def refuse(self, body: Any, raw: bytes) -> Refusal | None:
        if isinstance(body, dict) and body.get("tools") and not self.flags.get("tools", True):
            return Refusal(400, {"error": {"message": f"registry.ollama.ai/library/{body.get('model')} does not"
                                                      " support tools", "type": "api_error", "param": None,
                                           "code": None}}, "the model does not support tools")
        return super().refuse(body, raw)

    def message_fields(self, role: str) -> set[str] | None:
        return None

    def limits(self, body: dict[str, Any], raw: bytes) -> Refusal | None:
        return None  # a prompt beyond num_ctx is truncated silently (FakeProvider.truncated)


class LlamaCpp(Family):
    name = "llamacpp"
    strict_fields = False
    name_pattern = None
    max_tools = None

    def refuse(self, body: Any, raw: bytes) -> Refusal | None:
        if isinstance(body, dict) and body.get("tools") and not self.flags.get("jinja", True):
            return Refusal(500, {"error": {"code": 500, "message": "tools param requires --jinja flag",
                                           "type": "server_error"}}, "tools without --jinja")
        return super().refuse(body, raw)

    def message_fields(self, role: str) -> set[str] | None:
        return None

    def limits(self, body: dict[str, Any], raw: bytes) -> Refusal | None:
        n_ctx = self.flags.get("n_ctx", 1 << 20)
        if tokens(raw) > n_ctx:
            message = (f"request ({tokens(raw)} tokens) exceeds the available context size ({n_ctx} tokens), try"
                       " increasing it")
            return Refusal(400, {"error": {"code": 400, "message": message, "type": "exceed_context_size_error",
                                           "n_prompt_tokens": tokens(raw), "n_ctx": n_ctx}}, message)
        return None


class Vllm(Family):
    name = "vllm"
    strict_fields = False
    name_pattern = None
    max_tools = None

    def error(self, message: str, param: str | None = None, code: str | None = None) -> Refusal:
        return Refusal(400, {"object": "error", "message": message, "type": "BadRequestError", "param": param,
                             "code": 400}, message)

    def refuse(self, body: Any, raw: bytes) -> Refusal | None:
        auto = isinstance(body, dict) and body.get("tool_choice") == "auto"
        if auto and not self.flags.get("auto_tool_choice", True):
            return self.error('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        return super().refuse(body, raw)

    def message_fields(self, role: str) -> set[str] | None:
        return None

    def limits(self, body: dict[str, Any], raw: bytes) -> Refusal | None:
        length = self.flags.get("max_model_len", 1 << 20)
        completion = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        if tokens(raw) + completion > length:
            return self.error(f"This model's maximum context length is {length} tokens. However, you requested"
                              f" {tokens(raw) + completion} tokens ({tokens(raw)} in the messages, {completion} in"
                              " the completion). Please reduce the length of the messages or completion.")
        return None


KINDS: dict[str, type[Family]] = {k.name: k for k in (Family, DeepSeek, Qwen, Gemini, Ollama, LlamaCpp, Vllm)}


def family(name: str, model: str | None = None, **flags: Any) -> Family:
    return KINDS[name](model or MODELS[name], **flags)
