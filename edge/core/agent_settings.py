"""What the daemon's side of the AI operator and the child of an AI run agree on before any
run: the provider's settings and the table of provider profiles, the budgets, the
specialists, whom the child becomes, and tool names on the wire. Loaded with the daemon's
side of the operator (its configuration is checked against these at start); the shapes of
runs themselves (the job, the evidence) are edge.core.agent's, loaded by the first AI run."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

# -- endpoints --------------------------------------------------------------------------

_URL = re.compile(
    r"^(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>[0-9]{1,5}))?(?P<path>/[^?#\s]*)?$"
)


class Endpoint(msgspec.Struct, frozen=True, array_like=True):
    scheme: str
    host: str
    port: int
    path: str  # without a trailing slash

    @property
    def where(self) -> str:
        """host, or host:port when the port is not the scheme's own."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"


def endpoint(url: str) -> Endpoint | None:
    """`http(s)://host[:port][/path]`, nothing else (no user info, query or fragment); None otherwise."""
    m = _URL.match(url)
    if m is None or (m["port"] is not None and not 0 < int(m["port"]) < 65536):
        return None
    default = 443 if m["scheme"] == "https" else 80
    return Endpoint(m["scheme"], m["host"].strip("[]"), int(m["port"] or default), (m["path"] or "").rstrip("/"))


# -- provider profiles: every difference in request shape between providers, in one table --
#
# What each service documents (the tests' conformance fakes, tests/fake_provider.py, cite the
# pages): OpenAI refuses unknown fields, `max_tokens` on reasoning models (o-series, gpt-5) and
# function names outside ^[a-zA-Z0-9_-]{1,64}$; DeepSeek's thinking mode wants
# `reasoning_content` back on the assistant messages that called tools; Qwen3 on DashScope
# refuses a non-streaming call unless `enable_thinking` is false; the others take the
# OpenAI shape with `max_tokens`. Everything the child sends differently is one field here.

ProviderName = Literal["openai", "deepseek", "qwen", "gemini", "ollama", "llamacpp", "vllm", "generic"]


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    label: str  # as the owner knows it
    hosts: tuple[str, ...] = ()  # base_url hosts (or their parent domains) that name this profile
    port: int | None = None  # ... or this port on any host (Ollama's own)
    max_tokens_param: str = "max_tokens"
    reasoning_echo: bool = False  # pass `reasoning_content` back on assistant messages with tool calls
    thinking_off: bool = False  # send `enable_thinking: false` (non-streaming calls need it)


PROFILES: dict[str, Profile] = {p.name: p for p in (
    # max_completion_tokens: every current chat model takes it; the reasoning models refuse max_tokens.
    Profile(name="openai", label="OpenAI", hosts=("api.openai.com",), max_tokens_param="max_completion_tokens"),
    Profile(name="deepseek", label="DeepSeek", hosts=("api.deepseek.com",), reasoning_echo=True),
    Profile(name="qwen", label="Qwen (DashScope)", hosts=("dashscope.aliyuncs.com", "dashscope-intl.aliyuncs.com"),
            thinking_off=True),
    Profile(name="gemini", label="Gemini (OpenAI-compatible)", hosts=("generativelanguage.googleapis.com",)),
    Profile(name="ollama", label="Ollama", port=11434),
    Profile(name="llamacpp", label="llama.cpp server"),
    Profile(name="vllm", label="vLLM"),
    Profile(name="generic", label="an OpenAI-compatible server"),
)}


def detect_provider(base_url: str) -> str:
    """The profile `base_url` names unambiguously (its host, or Ollama's port), else generic."""
    found = endpoint(base_url)
    if found is None:
        return "generic"
    host = found.host.lower()
    for profile in PROFILES.values():
        if any(host == h or host.endswith("." + h) for h in profile.hosts) or found.port == profile.port:
            return profile.name
    return "generic"


# -- tool names on the wire --------------------------------------------------------------

def wire_name(name: str) -> str:
    """`name` as every provider accepts it, [A-Za-z][A-Za-z0-9_-]{0,63}: letters, digits, `_`
    and `-`, starting with a letter, at most 64 characters (qinglong.run.get -> qinglong_run_get)."""
    wire = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in name)
    if not wire[:1].isascii() or not wire[:1].isalpha():
        wire = "t" + wire
    return wire[:64]


def wire_names(names: list[str]) -> dict[str, str]:
    """Each tool name's wire name, unique: ValueError names two tools that would share one."""
    found: dict[str, str] = {}
    for name in names:
        wire = wire_name(name)
        if wire in found and found[wire] != name:
            raise ValueError(f"the tools {found[wire]!r} and {name!r} would both be offered to the model as"
                             f" {wire!r}: rename one")
        found[wire] = name
    return {name: wire for wire, name in found.items()}


class ProviderSettings(msgspec.Struct, kw_only=True):
    """One OpenAI-compatible chat-completions endpoint (the [agent] section or a profile)."""

    base_url: str
    model: str
    provider: str = "generic"  # a key of PROFILES
    api_key_file: str | None = None  # read by the child, never by the daemon
    ca_file: str | None = None  # None: the system's trust store
    proxy: str | None = None  # None: direct (the environment's proxy variables are never used)
    request_timeout_s: float = 120.0
    max_output_tokens: int = 4096
    max_tokens_param: str = "max_tokens"
    context_window_tokens: int = 65536
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None
    retries: int = 2


class Limits(msgspec.Struct, kw_only=True):
    """The budgets of one AI run, after its overrides were lowered to the configured maxima."""

    rounds: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    wall_clock_s: int
    tool_calls_per_round: int


class ChildUser(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Whom the child becomes once it has read its job (`[agent] user`, on a daemon that can
    switch users): never root, the daemon's user or their groups, so it cannot read the
    state directory; changing credentials also leaves it undumpable (no same-user tracing)."""

    uid: int
    gid: int
    groups: list[int]


# The operator model's specialist tools (seed 003): handled in the child, offered nowhere else.
PARENT_TOOLS = ("specialist.delegate", "specialist.correct", "specialist.revoke", "specialist.ask",
                "specialist.items")


class SpecialistSpec(msgspec.Struct, kw_only=True):
    """A no-tool role the operator may consult: [agent.specialists.NAME], defaults included."""

    name: str
    description: str | None  # one line for the operator's tool descriptions; None: the default's
    system: str | None  # its system text; None: the default's (edge.airun.specialists holds them)
    max_output_tokens: int  # the reply reserved in its context window and budgets
