"""One OpenAI-compatible chat-completions endpoint, over the standard library's http.client.

Egress goes to `base_url`'s host and port only, or through the configured HTTP proxy with
a tunnel to that host: a redirect is refused (never followed), the environment's proxy
variables are never read (http.client does not), and TLS is verified against the system's
trust store or `ca_file`. Requests are not streamed; a response is read within the
request's deadline and at most MAX_RESPONSE_BYTES. The deadline is total: connecting,
sending, the headers and the body together (a timer signal cuts whatever is blocked when it
runs out), so a server that drips a byte at a time cannot hold a request past it.

An error reply is shown in the provider's own words (OpenAI's `{"error": {"message"}}`,
vLLM's top-level `message`, Gemini's list of errors, a plain string), with one line of what
to change when the reply says what is wrong (`hint`).

Replies are read the way real servers send them: tool calls are detected by their
presence (not `finish_reason`), a missing call id is made up, `arguments` may be a JSON
string or an object, `usage` is optional, `content` may be a string, parts or null, and
`reasoning_content` is kept so it can be passed back (DeepSeek refuses a request without it).
"""

from __future__ import annotations

import http.client
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import msgspec

import edge
from edge.core.agent import ProviderSettings, endpoint

if TYPE_CHECKING:
    import ssl

MAX_RESPONSE_BYTES = 2 << 20
RETRY_STATUS = frozenset({408, 409, 425, 429})  # and every 5xx


class ProviderError(Exception):
    """A request that did not produce a reply; `code` is the run's error code."""

    def __init__(self, code: str, message: str, retryable: bool = False, retry_after_s: float | None = None,
                 status: int | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.status = status  # the HTTP status, when the provider answered
        self.hint = hint  # one line of what to change, when the reply says what is wrong


class _Deadline(Exception):
    """The request's total deadline ran out (raised by the timer's signal handler)."""


def _expired(signum: int, frame: object) -> None:
    raise _Deadline


# -- what servers send (lenient: unknown fields ignored, most fields optional) ----------


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: msgspec.Raw = msgspec.Raw()  # a JSON string holding an object, or an object; empty: absent


class _Call(msgspec.Struct):
    id: str | None = None
    function: _Function | None = None


class _Part(msgspec.Struct):
    text: str | None = None


class _Message(msgspec.Struct):
    content: str | list[_Part] | None = None
    tool_calls: list[_Call] | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Completion(msgspec.Struct):
    model: str | None = None
    choices: list[_Choice] = []
    usage: _Usage | None = None


_completion = msgspec.json.Decoder(_Completion)
_any = msgspec.json.Decoder()
_json = msgspec.json.Encoder()


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    name: str  # as the model sent it (a wire name, if it called what it was offered)
    arguments: dict[str, Any] | None  # None: the model sent something that is not a JSON object
    arguments_json: str  # what is passed back in the assistant message
    tool: str | None = None  # the offered tool it names (edge.airun.operator maps it back); None: none
    wire: str = ""  # the name passed back: a wire name whatever the model sent


class Reply(msgspec.Struct, kw_only=True):
    content: str
    tool_calls: list[ToolCall]
    reasoning: str | None
    model: str | None
    prompt_tokens: int | None  # None when the server sent no usage
    completion_tokens: int | None
    body_bytes: int


def _arguments(raw: msgspec.Raw) -> dict[str, Any] | None:
    if not len(raw):
        return {}
    try:
        value = _any.decode(raw)
        if isinstance(value, str):
            value = _any.decode(value) if value.strip() else {}
    except msgspec.DecodeError:
        return None
    if value is None:
        return {}
    return value if isinstance(value, dict) else None


def parse(body: bytes, round_number: int) -> Reply:
    """Read one chat-completions response; raises ProviderError(provider_malformed)."""
    try:
        completion = _completion.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProviderError("provider_malformed", f"the provider's reply is not a chat completion: {exc}",
                            retryable=True) from None
    if not completion.choices or completion.choices[0].message is None:
        raise ProviderError("provider_malformed", "the provider's reply has no message", retryable=True)
    message = completion.choices[0].message
    content = message.content
    if isinstance(content, list):
        content = "".join(part.text or "" for part in content)
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for index, call in enumerate(message.tool_calls or ()):
        function = call.function or _Function()
        call_id = call.id if call.id and call.id not in seen else f"call_{round_number}_{index}"
        seen.add(call_id)
        arguments = _arguments(function.arguments)
        calls.append(ToolCall(id=call_id, name=function.name or "", arguments=arguments,
                              arguments_json=_json.encode(arguments if arguments is not None else {}).decode()))
    usage = completion.usage
    prompt = usage.prompt_tokens if usage is not None else None
    completion_tokens = usage.completion_tokens if usage is not None else None
    if prompt is None or completion_tokens is None or prompt < 0 or completion_tokens < 0:
        prompt = completion_tokens = None
    return Reply(content=content or "", tool_calls=calls, reasoning=message.reasoning_content,
                 model=completion.model, prompt_tokens=prompt, completion_tokens=completion_tokens,
                 body_bytes=len(body))


class ChatClient:
    """Sends request bodies to `<base_url>/chat/completions`; one connection, kept alive."""

    def __init__(self, settings: ProviderSettings, api_key: str | None) -> None:
        target = endpoint(settings.base_url)
        if target is None:
            raise ValueError(f"base_url {settings.base_url!r} must be http(s)://host[:port][/path]")
        self.host, self.port, self.https = target.host, target.port, target.scheme == "https"
        self.path = target.path + "/chat/completions"
        self.where = target.where
        self._proxy = endpoint(settings.proxy) if settings.proxy else None
        self._ca_file = settings.ca_file
        self._headers = {
            "Content-Type": "application/json", "Accept": "application/json",
            "User-Agent": f"qledge/{edge.__version__}",
        }
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._conn: http.client.HTTPConnection | None = None
        self._secret = api_key or ""
        # Made now, with the trust store read now: the child may become a user that cannot
        # read the interpreter's files before its first connection.
        self._context = _tls_context(self._ca_file) if self.https else None

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        host, port = self.host, self.port
        if self._proxy is not None:
            host, port = self._proxy.host, self._proxy.port
        conn: http.client.HTTPConnection
        if self._context is not None:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=self._context)
            if self._proxy is not None:
                conn.set_tunnel(self.host, self.port)  # the proxy only ever reaches base_url's host
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def send(self, body: bytes, timeout_s: float) -> bytes:
        """POST one request and return the body of a 2xx reply within `timeout_s` in all;
        raises ProviderError."""
        deadline = time.monotonic() + timeout_s
        # The child's one thread is the main thread: a timer signal bounds the whole exchange.
        timed = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGALRM, _expired) if timed else None
        try:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, max(timeout_s, 0.001))
            return self._exchange(body, timeout_s, deadline)
        except ProviderError:
            self.close()
            raise
        except (TimeoutError, _Deadline):
            self.close()
            raise ProviderError("provider_timeout", f"{self.where} did not answer within {timeout_s:g}s (the whole"
                                " request: connect, send, headers and body)", retryable=True) from None
        except (http.client.HTTPException, ConnectionError) as exc:
            self.close()
            raise ProviderError("provider_unreachable", f"the connection to {self.where} failed: {_name(exc)}",
                                retryable=True) from None
        except OSError as exc:
            self.close()
            if type(exc).__name__.startswith("SSL"):  # certificate or handshake: retrying cannot help
                raise ProviderError("provider_tls", f"TLS with {self.where} failed: {exc}") from None
            raise ProviderError("provider_unreachable", f"cannot reach {self.where}: {exc}", retryable=True) from None
        finally:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

    def _exchange(self, body: bytes, timeout_s: float, deadline: float) -> bytes:
        if self._conn is None:
            self._conn = self._connect(timeout_s)
        conn = self._conn
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        path = self.path
        if self._proxy is not None and not self.https:
            path = f"http://{self.where}{self.path}"  # a plain proxy is given the absolute URL
        conn.request("POST", path, body=body, headers=self._headers)
        response = conn.getresponse()
        data = self._read(conn, response, deadline)
        status = response.status
        if 300 <= status < 400:
            found = endpoint(response.getheader("Location") or "")
            location = found.where if found is not None else "elsewhere"
            raise ProviderError("provider_redirect", f"{self.where} answered HTTP {status} (a redirect to"
                                f" {location}); redirects are not followed: check base_url")
        if status >= 400:
            retryable = status in RETRY_STATUS or status >= 500
            reason = self._reason(data, response)
            raise ProviderError("provider_http", f"HTTP {status} from {self.where}: {reason}",
                                retryable=retryable, retry_after_s=_retry_after(response.getheader("Retry-After")),
                                status=status, hint=hint(status, reason))
        if response.will_close:
            self.close()
        return data

    def _read(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = response.read(65536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise ProviderError("provider_malformed", f"the reply from {self.where} is larger than"
                                    f" {MAX_RESPONSE_BYTES >> 20} MiB")
            chunks.append(chunk)

    def _reason(self, data: bytes, response: http.client.HTTPResponse) -> str:
        """The provider's own error message when it sent one, bounded, the key never included."""
        try:
            text = error_text(_any.decode(data))
        except (msgspec.DecodeError, RecursionError):
            text = ""
        text = " ".join((text or response.reason or "").split())[:REASON_MAX]
        return text.replace(self._secret, "***") if self._secret else text


REASON_MAX = 300


def error_text(value: Any) -> str:
    """The message of an error reply, whichever shape the server uses: `{"error": {"message"}}`
    (OpenAI and most), `{"error": "…"}`, `{"message": "…"}` (vLLM), or a list of those (Gemini)."""
    if isinstance(value, list):
        return "; ".join(t for t in (error_text(v) for v in value[:4]) if t)
    if not isinstance(value, dict):
        return value if isinstance(value, str) else ""
    error = value.get("error")
    if isinstance(error, str):
        return error
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    message = value.get("message")
    return message if isinstance(message, str) else ""


# (what the provider's own message says, what to change): the first that matches is the line shown.
# Worded so that the log's masking (edge.core.redaction) leaves them whole: no "token…: value".
_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("max_completion_tokens",), 'this model wants max_completion_tokens instead of max_tokens; in [agent], set'
                                 ' max_tokens_param to "max_completion_tokens" (or provider = "openai")'),
    (("enable_thinking",), 'Qwen3 models answer non-streaming calls only with thinking off: set [agent] provider ='
                           ' "qwen"'),
    (("reasoning_content",), 'the provider wants reasoning_content passed back on tool calls: set [agent] provider ='
                             ' "deepseek"'),
    (("--enable-auto-tool-choice",), "start vLLM with --enable-auto-tool-choice and the --tool-call-parser of this"
                                     " model (e.g. hermes for Qwen, llama3_json for Llama 3.1)"),
    (("--jinja",), "start llama-server with --jinja (its tool calling needs the model's chat template)"),
    (("does not support tools", "does not support tool", "tool calling is not supported", "tools are not supported"),
     "this model cannot call tools: choose one that can (Ollama lists them under Tools)"),
    (("context length", "context size", "context window", "context_length", "exceeds the available context",
      "maximum context"), "lower [agent] context_window_tokens (and max_output_tokens) to what the server serves,"
                          " or serve the model with a larger context"),
    (("unrecognized request argument", "unknown parameter", "additional properties", "unsupported parameter",
      "extra inputs are not permitted", "unknown field"),
     "the provider refused a field of the request: set [agent] provider to the one you use (openai, deepseek,"
     " qwen, gemini, ollama, llamacpp, vllm, generic)"),
)


def hint(status: int, message: str) -> str | None:
    """One line of what to change for an error reply, or None when there is nothing to say."""
    low = message.lower()
    for needles, line in _HINTS:
        if any(n in low for n in needles):
            return line
    if status in (401, 403):
        return ("check the key in api_key_file; the provider refused it (wrong, expired, or for another provider or"
                " region)")
    if status == 404:
        return ("check model (is it served there?) and base_url (the API root, e.g. https://api.openai.com/v1,"
                " http://host:11434/v1, …/compatible-mode/v1)")
    if status == 429:
        return "the provider's rate limit or quota: wait, or raise them with the provider"
    return None


def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    import ssl  # only for https: the module costs ~4.5 MiB

    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _name(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__

