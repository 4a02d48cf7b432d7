"""Generated parts of the documentation: the CLI reference from the argparse parser, the
configuration table from the config Structs, the performance figures from
bench/results/latest.json (and the flash figures the OpenWrt configuration quotes), the
OpenWrt package sizes from bench/results/openwrt.json.

    python packaging/docs.py          # rewrite the generated parts in place
    python packaging/docs.py --check  # exit 1 naming each file that differs

Each generated part sits between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->`
in its file; the prose around it is written by hand. tests/test_docs.py fails when a
committed part differs from what this module generates. Not shipped (it lives outside edge/).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = "python packaging/docs.py"


# -- the CLI reference ------------------------------------------------------------------------

def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str | None, argparse.ArgumentParser]]:
    """(name, help, parser) of each sub-command, aliases once, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield name, helps.get(name), sub


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option_rows(parser: argparse.ArgumentParser, skip: set[str]) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if (action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction,
                                                                    argparse._SubParsersAction))
                or set(action.option_strings) & skip):
            continue
        if action.option_strings:
            name = ", ".join(f"`{o}`" for o in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}`"
        value = ""
        if action.option_strings and action.nargs != 0:
            value = f"`{formatter._format_args(action, formatter._get_default_metavar_for_optional(action))}`"
        elif not action.option_strings and action.nargs not in (None, 1):
            value = f"`{formatter._format_args(action, action.metavar or action.dest)}`"
        if action.choices is not None and not isinstance(action.choices, dict):
            value = " \\| ".join(f"`{c}`" for c in action.choices)
        default = action.default
        shown = "" if default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {name} | {value} | {shown} | {_cell(help_text)} |")
    return rows


def _command_sections(parser: argparse.ArgumentParser, path: str, skip: set[str]) -> list[str]:
    out = []
    for name, help_text, sub in _subcommands(parser):
        here = f"{path} {name}"
        out += ["", f"### `{here}`"]
        about = sub.description or help_text or ""
        if about:
            out += ["", about.strip()]
        rows = _option_rows(sub, skip)
        if rows:
            out += ["", "| argument | value | default | meaning |", "|---|---|---|---|", *rows]
        if sub.epilog:
            out += ["", "```text", sub.epilog.strip("\n"), "```"]
        out += _command_sections(sub, here, skip)
    return out


def cli_reference() -> str:
    """Every command and option of `qledge`, walked from the parser `build_parser()` returns."""
    os.environ["COLUMNS"] = "100"  # argparse wraps %(...)s help to the terminal
    from edge.cli.main import build_parser

    parser = build_parser()
    root = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    skip = {o for a in root for o in a.option_strings}
    out = ["### Global options", "", "Before or after the command.", "",
           "| argument | value | default | meaning |", "|---|---|---|---|",
           *_option_rows(parser, {"-h", "--help"})]
    out += _command_sections(parser, parser.prog, skip | {"-h", "--help"})
    return "\n".join(out) + "\n"


# -- the configuration table ------------------------------------------------------------------

# key: (what the default means where the code's is "unset", else a note beside the code's
# default or ""; meaning). The key, its type and its default come from the Structs; a key the
# Structs have and this table lacks, or the reverse, fails the generation.
CONFIG_KEYS: dict[str, tuple[str, str]] = {
    'home': (
        '`$QLEDGE_HOME`, else `$XDG_STATE_HOME/qledge`',
        'state directory (database, logs, pepper, socket)'),
    'socket': (
        '`<home>/qledge.sock`',
        'tool socket'),
    'loop': (
        '',
        '`auto` (uvloop if installed), `uvloop`, `asyncio`'),
    'timezone': (
        'device zone, else UTC',
        "zone a trigger gets when `--tz` is not given, and runs' `TZ`; the device zone is read from "
        "`$TZ`, `/etc/timezone`, the `/etc/localtime` link or OpenWrt's `system.zonename`. A zone "
        'that cannot be loaded is refused at start-up (exit 2), as is a `$TZ` that names no zone'),
    'project': (
        '',
        'project id of everything this daemon stores'),
    'max_frame_bytes': (
        '',
        'request frame cap'),
    'log_level': (
        '',
        '`debug`, `info`, `warning`, `error`'),
    '[auth] owner_uids': (
        'daemon uid and 0',
        'uids authenticated as owner without a token'),
    '[store] synchronous': (
        '',
        'SQLite `synchronous` (`OFF`, `NORMAL`, `FULL`, `EXTRA`)'),
    '[store] cache_kib': (
        '',
        'SQLite page cache'),
    '[store] ballast_bytes': (
        '',
        'space kept in `<home>/ballast` and given back on a full disk (0: none)'),
    '[store] exclusive_lock': (
        'OpenWrt: on',
        'the daemon alone holds the database: no `-shm` file (about half of what a run a minute '
        'writes to flash, see [Flash wear](../performance.md#flash-wear)), but no other program '
        '(`sqlite3`) can open it while the daemon runs'),
    '[runner] concurrency': (
        '',
        'runs executing at once'),
    '[runner] queue_limit': (
        '',
        'runs waiting for a slot'),
    '[runner] log_cap_bytes': (
        '',
        'per-run log cap'),
    '[runner] kill_grace_s': (
        '',
        'SIGTERM → SIGKILL grace on timeout/cancel'),
    '[runner] disk_reserve_bytes': (
        '',
        'free space a run needs to start'),
    '[runner] task_users': (
        '',
        "users a task may run as without `task.privileged` (never root or the daemon's user: refused "
        'at start)'),
    '[runner] default_user': (
        'first of `task_users`',
        'user a new task gets when it names none (e.g. `"root"`: tasks privileged unless they name a '
        'task user)'),
    '[runner] work_dir': (
        '',
        'working directory of runs whose task names none (never inside the state directory)'),
    '[runner] dynamic_uids': (
        '',
        'the uids (first, last) a task that uses a secret runs as, one of its own, instead of a '
        'shared task user ([Security model](../security.md#security-model)); `[]`: none'),
    '[retention] runs_per_task': (
        '',
        'finished runs kept per task (at least 65)'),
    '[retention] run_max_age_days': (
        '',
        'oldest finished run kept'),
    '[retention] log_quota_bytes': (
        '',
        'total log bytes kept'),
    '[retention] audit_max_rows': (
        '',
        'audit rows of allowed calls kept'),
    '[retention] audit_change_max_rows': (
        '',
        'audit rows of credential and secret changes kept'),
    '[retention] audit_refused_max_rows': (
        '',
        'aggregate rows of refused calls kept (one per principal, cause and minute)'),
    '[retention] audit_max_age_days': (
        '',
        'oldest audit row kept (any class)'),
    '[connections] max_per_socket': (
        '',
        'connections each socket holds; at the cap the longest-silent unauthenticated one is closed '
        'to make room, else the newcomer is refused (`resource_exhausted`)'),
    '[connections] frame_timeout_s': (
        '',
        'a request frame or MCP line, once started, must arrive whole within this; an answer must be '
        'taken by the peer within it too'),
    '[connections] idle_timeout_s': (
        '',
        'a connection on which no call has authenticated, silent with nothing in flight, is closed '
        'after this (0: never)'),
    '[connections] session_idle_timeout_s': (
        '',
        'the same once a call has authenticated (0: never, so MCP sessions stay)'),
    '[connections] partial_bytes': (
        '',
        'bytes of partly received requests all connections together may hold beyond 16 KiB each (at '
        'least one request of the largest size allowed)'),
    '[connections] fd_reserve': (
        '',
        'descriptors kept for runs, logs and the database: connections never use them'),
    '[mcp] enabled': (
        '',
        'serve MCP on a second socket'),
    '[mcp] socket': (
        '`<home>/mcp.sock`',
        'MCP socket'),
    '[mcp] max_line_bytes': (
        '',
        'longest MCP message accepted (longer: error -32600, connection closed)'),
    '[cluster] dsn': (
        'unset',
        'PostgreSQL to share with other nodes (libpq URI or `key=value`; TLS and every libpq option '
        'pass through); set: this daemon is a cluster node and keeps nothing in SQLite (see [Cluster '
        'mode](../cluster.md#cluster-mode))'),
    '[cluster] node': (
        'host name + `:` + a digest of `home`',
        "this node's id, unique in the cluster and stable across restarts (its previous life's runs "
        'are its own to reconcile)'),
    '[cluster] lease_s': (
        '',
        "how long a node's claim on a run lasts without a heartbeat; a run whose lease expired "
        'becomes `lost`'),
    '[cluster] heartbeat_s': (
        '',
        'heartbeat (lease renewal, reaping, PostgreSQL clock sample); at most half of `lease_s`'),
    '[cluster] poll_s': (
        '',
        'longest wait before a node looks for queued runs without a wake-up hint (0.2–5)'),
    '[cluster] pool_size': (
        '',
        'PostgreSQL connections of this node (plus one for hints)'),
    '[cluster] connect_timeout_s': (
        '',
        'libpq connect timeout'),
    '[cluster] write_retry_s': (
        '',
        "how long a run's status change is retried across a lost connection (every change is a "
        'compare-and-set)'),
    '[notify] device': (
        'the host name',
        'what messages call this device'),
    '[notify] language': (
        '',
        '`en` or `zh`: the built-in message templates (a channel may set its own `language`)'),
    '[notify] max_attempts': (
        '',
        'attempts per message before it is given up (a 4xx other than 408/429 gives up at once)'),
    '[notify] backoff_s': (
        '',
        'wait after a failed attempt, doubling each time'),
    '[notify] max_backoff_s': (
        '',
        'the longest wait between attempts'),
    '[notify] per_minute': (
        '',
        'requests per channel in any 60 s; more waits, and goes as one summary'),
    '[notify] timeout_s': (
        '',
        'per attempt, from the first connect to the last byte of the last reply'),
    '[notify] repeat_s': (
        '',
        "a task that keeps failing: the first reminder after its first failure's message; 0: a "
        'message for every failure'),
    '[notify] repeat_factor': (
        '',
        'each next reminder this many times as long after the one before'),
    '[notify] max_repeat_s': (
        '',
        'the longest wait between reminders'),
    '[notify] python': (
        "the daemon's interpreter",
        'what the sender child runs on'),
    '[agent] enabled': (
        '',
        'the [AI operator](../ai.md#ai-operator): AI tasks, `qledge ask`, the evidence history'),
    '[agent] base_url': (
        'none',
        'an OpenAI-compatible API root, `http(s)://host[:port][/path]` (required when enabled)'),
    '[agent] model': (
        'none',
        'the model name the endpoint expects (required when enabled)'),
    '[agent] api_key_file': (
        'none',
        "a file holding the provider's key, mode 0600; read by each AI run's child, never logged or "
        'returned'),
    '[agent] input_usd_per_mtok': (
        'none',
        'price of a million input tokens; with the output price, the cost is estimated and budgeted'),
    '[agent] output_usd_per_mtok': (
        'none',
        'price of a million output tokens'),
    '[agent] context_window_tokens': (
        '',
        "the model's context window: a request and `max_output_tokens` must fit it"),
    '[agent] request_timeout_s': (
        '',
        "one request's total deadline: connecting, sending, the headers and the body together (never "
        'beyond the wall-clock budget)'),
    '[agent] max_output_tokens': (
        '',
        'the most a reply may use, sent with every request'),
    '[agent] max_tokens_param': (
        "the profile's",
        'the request field it goes in: `max_tokens`, or `max_completion_tokens` (the `openai` '
        "profile's: OpenAI's reasoning models refuse `max_tokens`)"),
    '[agent] provider': (
        "named by `base_url`'s host",
        "the provider's [profile](../ai.md#providers): `openai`, `deepseek`, `qwen`, `gemini`, "
        '`ollama`, `llamacpp`, `vllm` or `generic`; unset, the host names it where that is '
        'unambiguous (api.openai.com, api.deepseek.com, dashscope(-intl).aliyuncs.com, '
        'generativelanguage.googleapis.com, port 11434 for Ollama), else `generic`'),
    '[agent] retries': (
        '',
        'retries of a request that may pass (0..5), with backoff'),
    '[agent] attempts': (
        '',
        'attempts of a [mission](../ai.md#specialists-and-missions), 1..16: when the provider fails '
        'an attempt (`provider_*`), the next one starts by itself until this many have run (a cluster'
        ' node keeps no missions: above 1 is refused there)'),
    '[agent] ca_file': (
        'system store',
        'CA bundle to verify TLS with (OpenWrt: `/etc/ssl/certs/ca-certificates.crt`)'),
    '[agent] proxy': (
        'none',
        "`http://host:port` to tunnel through; the environment's proxy variables are never used"),
    '[agent] read_logs': (
        '',
        'offer the model `qinglong.run.log.excerpt`'),
    '[agent] concurrency': (
        '',
        'AI runs executing at once (slots of their own)'),
    '[agent] user': (
        '',
        "the user each AI run's child becomes, on a root daemon, once it has read its job and before "
        "it reads anything from the provider or a tool (never root, the daemon's user or their "
        "groups: refused at start); on a daemon that is not root the child stays the daemon's user"),
    '[agent] budget_rounds': (
        '',
        'model requests per run (the maximum a task may ask for too)'),
    '[agent] budget_input_tokens': (
        '',
        'input tokens per run'),
    '[agent] budget_output_tokens': (
        '',
        'output tokens per run'),
    '[agent] budget_cost_usd': (
        '',
        'estimated cost per run (when both prices are set)'),
    '[agent] budget_wall_clock_s': (
        '',
        'wall-clock seconds per run: the runner kills the child then'),
    '[agent] tool_calls_per_round': (
        '',
        'tool calls run per round; more are answered as refused'),
    '[agent.profiles.NAME] base_url': (
        "`[agent]`'s",
        'a second endpoint or model an AI task may name (`profile`); each key unset here is '
        "`[agent]`'s"),
    '[agent.profiles.NAME] model': (
        "`[agent]`'s",
        ''),
    '[agent.profiles.NAME] provider': (
        "`[agent]`'s, or what its own `base_url` names",
        ''),
    '[agent.profiles.NAME] max_tokens_param': (
        "`[agent]`'s, else its profile's",
        ''),
    '[agent.profiles.NAME] api_key_file': (
        "`[agent]`'s",
        ''),
    '[agent.profiles.NAME] input_usd_per_mtok': (
        "`[agent]`'s",
        ''),
    '[agent.profiles.NAME] output_usd_per_mtok': (
        "`[agent]`'s",
        ''),
    '[agent.profiles.NAME] context_window_tokens': (
        "`[agent]`'s",
        ''),
    '[agent.profiles.NAME] max_output_tokens': (
        "`[agent]`'s",
        ''),
    '[agent.specialists.NAME] enabled': (
        '',
        'a [specialist](../ai.md#specialists-and-missions) the operator may consult (`log-analyst` '
        'and `schedule-advisor` are built in; `enabled = false` turns one off)'),
    '[agent.specialists.NAME] description': (
        "the default's",
        'one line the operator model is shown (required for a new NAME: lowercase letters, digits and'
        ' `-`)'),
    '[agent.specialists.NAME] system': (
        "the default's",
        'its system text, at most 4,000 characters (required for a new NAME)'),
    '[agent.specialists.NAME] max_output_tokens': (
        "1024 (never above `[agent]`'s)",
        'the reply a specialist request reserves in the context window and the budgets'),
}


def _type_name(info: Any) -> str:
    import msgspec.inspect as mi

    if isinstance(info, mi.UnionType):
        kinds = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return " or ".join(_type_name(t) for t in kinds)
    if isinstance(info, mi.LiteralType):
        return " \\| ".join(f"`{v}`" for v in info.values)
    if isinstance(info, (mi.IntType, mi.FloatType)):
        kind = "integer" if isinstance(info, mi.IntType) else "number"
        low = info.ge if info.ge is not None else (f">{info.gt}" if info.gt is not None else None)
        high = info.le if info.le is not None else (f"<{info.lt}" if info.lt is not None else None)
        if low is not None and high is not None:
            return f"{kind} {low}..{high}"
        if low is not None:
            return f"{kind} ≥ {low}" if not str(low).startswith(">") else f"{kind} {low}"
        return kind
    if isinstance(info, mi.StrType):
        return f"text ≤ {info.max_length}" if info.max_length else "text"
    if isinstance(info, mi.BoolType):
        return "boolean"
    if isinstance(info, mi.ListType):
        most = f", ≤ {info.max_length}" if info.max_length else ""
        return f"list of {_type_name(info.item_type)}{most}"
    return type(info).__name__.removesuffix("Type").lower()


def _default(field: Any) -> object:
    import msgspec

    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return None


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, list):
        return f"`{json.dumps(value)}`"
    return str(value)


def _config_keys() -> list[tuple[str, str, object]]:
    """(key, type, code default) of every configuration key, as the Structs declare them."""
    import msgspec
    import msgspec.inspect as mi

    from edge.app import config

    found: list[tuple[str, str, object]] = []

    def walk(struct: type, prefix: str) -> None:
        info = mi.type_info(struct)
        for field, spec in zip(msgspec.structs.fields(struct), info.fields, strict=True):  # type: ignore[attr-defined]
            kind = spec.type
            if isinstance(kind, mi.StructType):
                walk(kind.cls, f"[{field.name}] ")
            elif isinstance(kind, mi.DictType) and isinstance(kind.value_type, mi.StructType):
                table = prefix.strip("[] ")
                walk(kind.value_type.cls, f"[{table}.{field.name}.NAME] ")
            else:
                found.append((prefix + field.name, _type_name(kind), _default(field)))

    walk(config.Config, "")
    return found


def configuration_table() -> str:
    keys = _config_keys()
    names = [k for k, _, _ in keys]
    missing = [k for k in names if k not in CONFIG_KEYS]
    extra = [k for k in CONFIG_KEYS if k not in names]
    if missing or extra:
        raise SystemExit(f"packaging/docs.py CONFIG_KEYS: add {missing}, remove {extra}")
    out = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default in keys:
        human, meaning = CONFIG_KEYS[key]
        shown = human if default is None or default == {} else _shown(default) + (f" ({human})" if human else "")
        out.append(f"| `{key}` | {kind} | {shown} | {meaning} |")
    return "\n".join(out) + "\n"


# -- performance figures ----------------------------------------------------------------------

def _mib(memory: dict[str, float], *names: str) -> str:
    return " / ".join(f"{memory[n]:.1f}" for n in names) + " MiB"


def _kb(n: float) -> str:
    return f"{n / 1000:.1f} KB"


def _spread(ratio: dict[str, float]) -> str:
    """min–max (median) of the pairs' ratios of one run."""
    return f"{ratio['min']:.2f}–{ratio['max']:.2f} (median {ratio['median']:.2f})"


def performance_table() -> str:
    """The budgeted figures of bench/results/latest.json, as the last bench run wrote them."""
    with open(os.path.join(ROOT, "bench", "results", "latest.json")) as f:
        results = json.load(f)
    try:
        return _performance_table(results)
    except KeyError as exc:  # a bench run of a single test writes a partial section
        raise SystemExit(f"bench/results/latest.json has no {exc}: run `pytest bench/test_budgets.py` "
                         f"and `pytest bench/test_speed.py` whole, then {COMMAND}") from None


def _performance_table(results: dict[str, Any]) -> str:
    b, speed, machine = results["budgets"], results["speed"], results["machine"]
    limit = b["budget"]
    flash = b["flash"]
    one, many = speed["tool_call_1_client"], speed["tool_call_16_clients"]
    floor = results["call_floor"]
    rows = [
        ("default daemon idle VmHWM / RssAnon / PSS", _mib(b["default"]["memory_mib"], "VmHWM", "RssAnon", "Pss"),
         f"≤ {limit['default_hwm_mib']:g} / ≤ {limit['default_rss_anon_mib']:g} MiB"),
        ("modules loaded by the default daemon", str(b["default"]["module_count"]), "reported"),
        ("MCP-enabled daemon idle VmHWM / RssAnon / PSS", _mib(b["mcp"]["memory_mib"], "VmHWM", "RssAnon", "Pss"),
         f"≤ {limit['mcp_hwm_mib']:g} MiB"),
        ("`[agent]`-enabled daemon idle VmHWM / RssAnon / PSS",
         _mib(b["agent"]["memory_mib"], "VmHWM", "RssAnon", "Pss")
         + f": +{b['agent']['over_agent_off_mib']['VmHWM']:.2f} MiB VmHWM over the same config with it off",
         f"≤ +{limit['agent_over_default_mib']:g} MiB"),
        ("uvloop variant idle VmHWM / RssAnon / PSS", _mib(b["uvloop"]["memory_mib"], "VmHWM", "RssAnon", "Pss"),
         "reported (opt-in)"),
        ("`qledge mcp` bridge VmHWM / PSS", _mib(b["bridge"]["memory_mib"], "VmHWM", "Pss"),
         f"≤ {limit['bridge_rss_mib']:g} MiB"),
        ("edge `.pyz`", f"{b['edge_pyz']['bytes']:,} bytes, {b['edge_pyz']['files']} files",
         f"≤ {limit['edge_pyz_bytes'] // 1024} KiB, ≤ {limit['edge_pyz_files']} files"),
        ("idle wake-ups (all threads)", f"{b['default']['idle_wakeups_per_min']:g} per minute",
         f"≤ {limit['idle_wakeups_per_min']:g} per minute"),
        ("start-up to socket ready", f"{speed['startup_to_ready_s']['median']:.2f} s median", "reported"),
        ("tool call round trip, 1 client",
         f"p50 {one['p50_ms']:.2f} ms, p99 {one['p99_ms']:.2f} ms, {one['calls_per_s']:,.0f} calls/s", "reported"),
        ("tool call round trip, 16 clients",
         f"p50 {many['p50_ms']:.1f} ms, p99 {many['p99_ms']:.1f} ms, {many['calls_per_s']:,.0f} calls/s", "reported"),
        ("audited read (`qledge.task.get`) over its floor (`bench/floor_server.py`): server CPU per call, "
         "1 / 16 clients",
         f"{_spread(floor['cpu_us_per_call']['ratio'])}× / {_spread(floor['clients_16_cpu_us_per_call']['ratio'])}×",
         f"median ≤ {floor['cpu_ratio_budget']:g}× / ≤ {floor['clients_cpu_ratio_budget']:g}×"),
        ("same, calls/s over the floor's, 1 / 16 clients",
         f"{_spread(floor['sequential_calls_per_s']['ratio'])} / {_spread(floor['clients_16_calls_per_s']['ratio'])}",
         "reported"),
        (f"run admission + completion (`true`, concurrency {speed['runs']['concurrency']})",
         f"{speed['runs']['runs_per_s']:.0f} runs/s", "reported"),
        ("flash: bytes written per finished quiet run of a once-a-minute job",
         _kb(flash["per_scheduled_run_one_a_minute"]), f"≤ {limit['flash_per_scheduled_run_bytes'] / 1024:g} KiB"),
        ("flash: per manual run, with its `run start` and `run wait` calls", _kb(flash["per_manual_run"]),
         f"≤ {limit['flash_per_manual_run_bytes'] / 1024:g} KiB"),
        ("flash: per audited read call", _kb(flash["per_audited_read_call"]),
         f"≤ {limit['flash_per_audited_read_call_bytes'] / 1024:g} KiB"),
        ("flash: per run a minute apart (writeback between runs) / per day",
         f"{_kb(flash['per_scheduled_run_one_a_minute_written_back'])} / "
         f"{flash['per_day_at_one_run_a_minute_bytes'] / 1e6:.0f} MB; with `exclusive_lock` "
         f"{_kb(flash['per_scheduled_run_one_a_minute_written_back_exclusive_lock'])} / "
         f"{flash['per_day_at_one_run_a_minute_exclusive_lock_bytes'] / 1e6:.0f} MB", "reported"),
    ]
    out = [f"Measured on {machine['cpu']} ({machine['cpus']} vCPU), Linux {machine['kernel'].split('-')[0]}, "
           f"{machine['implementation']} {machine['python']} (`bench/results/latest.json`, "
           f"{b['measured_at'][:10]}):", "",
           "| figure | measured | budget |", "|---|---|---|"]
    out += [f"| {figure} | {measured} | {budget} |" for figure, measured, budget in rows]
    return "\n".join(out) + "\n"


# -- OpenWrt package sizes ----------------------------------------------------------------------

OPENWRT_RECORD = "bench/results/openwrt.json"
# The order the install guide speaks of them: the daemon, the panel, the optional rest.
OPENWRT_ORDER = ("qledge", "qledge-web", "luci-app-qledge", "qledge-mcp", "python3-cronsim")


def _bytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1000:.1f} KB"


def openwrt_sizes() -> str:
    """The sizes of the packages packaging/build_openwrt.py built last (its --record)."""
    with open(os.path.join(ROOT, OPENWRT_RECORD)) as f:
        record = json.load(f)
    packages = record["packages"]
    names = [n for n in OPENWRT_ORDER if n in packages] + sorted(set(packages) - set(OPENWRT_ORDER))
    fmt = record["format"]
    out = [f"qledge's own packages as `python packaging/build_openwrt.py --format {fmt}` builds them "
           f"(bytecode for Python {record['python']}; `{OPENWRT_RECORD}`, {record['measured_at'][:10]}):", "",
           "| package | file | installed |", "|---|---|---|"]
    for name in names:
        entry = packages[name]
        installed = entry.get("installed_bytes")
        out.append(f"| `{name}` | {_bytes(entry['bytes'])} ({entry['bytes']:,} bytes) | "
                   + (f"{_bytes(installed)} ({installed:,} bytes)" if installed is not None else "not read") + " |")
    other = {"ipk": "apk", "apk": "ipk"}[fmt]
    out += ["", f"The `.{other}` packages hold the same files; their sizes were not measured."]
    return "\n".join(out) + "\n"


# -- the generated parts in their files -------------------------------------------------------

PARTS: dict[str, tuple[str, Callable[[], str]]] = {
    "cli": ("docs/reference/cli.md", cli_reference),
    "configuration": ("docs/reference/configuration.md", configuration_table),
    "performance": ("docs/performance.md", performance_table),
    "openwrt-sizes": ("docs/install-openwrt.md", openwrt_sizes),
}


def bash_completion() -> str:
    from edge.cli.completion import script

    return script("bash")


# Files generated whole: path, what makes it.
FILES: dict[str, Callable[[], str]] = {
    "openwrt/qledge/files/qledge.bash-completion": bash_completion,  # the package installs it
}

# The flash figures the OpenWrt configuration quotes beside `state_dir`, from the measured
# ones (a sentence of a file that ships, so no markers around it): path, the sentence's
# pattern, what it says now.
_FLASH_SENTENCE = re.compile(
    r"nothing costs about [0-9.]+ KB per run there \([0-9]+ MB a day; [0-9.]+ KB and [0-9]+ MB without\n"
    r"(\t# )exclusive_lock\)")


def _flash_sentence(match: re.Match[str]) -> str:
    with open(os.path.join(ROOT, "bench", "results", "latest.json")) as f:
        flash = json.load(f)["budgets"]["flash"]
    return (f"nothing costs about {_kb(flash['per_scheduled_run_one_a_minute_written_back_exclusive_lock'])} per run"
            f" there ({flash['per_day_at_one_run_a_minute_exclusive_lock_bytes'] / 1e6:.0f} MB a day;"
            f" {_kb(flash['per_scheduled_run_one_a_minute_written_back'])} and"
            f" {flash['per_day_at_one_run_a_minute_bytes'] / 1e6:.0f} MB without\n{match.group(1)}exclusive_lock)")


SENTENCES: dict[str, tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = {
    "openwrt/qledge/files/qledge.config": (_FLASH_SENTENCE, _flash_sentence),
}


def sentenced(path: str) -> str:
    """The file at `path` with its generated sentence as the figures say it now."""
    pattern, make = SENTENCES[path]
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    new, found = pattern.subn(make, text)
    if found != 1:
        raise SystemExit(f"{path}: the sentence {pattern.pattern!r} is not in it once")
    return new


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated: {name} (edit the source, then run {COMMAND}) -->\n",
            f"<!-- end generated: {name} -->\n")


def rendered(name: str) -> tuple[str, str]:
    """(path, the file's text with the part `name` as the code generates it now)."""
    path, make = PARTS[name]
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    begin, end = _markers(name)
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: no {begin.strip()} ... {end.strip()} in it")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return path, head + begin + make() + end + tail


def stale() -> list[str]:
    """The files whose generated parts differ from what the code generates."""
    found = []
    for name in PARTS:
        path, text = rendered(name)
        with open(os.path.join(ROOT, path)) as f:
            if f.read() != text:
                found.append(path)
    for path, make in FILES.items():
        try:
            with open(os.path.join(ROOT, path)) as f:
                if f.read() != make():
                    found.append(path)
        except FileNotFoundError:
            found.append(path)
    for path in SENTENCES:
        with open(os.path.join(ROOT, path)) as f:
            if f.read() != sentenced(path):
                found.append(path)
    return found


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        old = stale()
        for path in old:
            print(f"{path} differs from what the code generates: run {COMMAND}", file=sys.stderr)
        return 1 if old else 0
    if argv:
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    for name in PARTS:
        path, text = rendered(name)
        with open(os.path.join(ROOT, path), "w") as f:
            f.write(text)
    for path, make in FILES.items():
        with open(os.path.join(ROOT, path), "w") as f:
            f.write(make())
    for path in SENTENCES:
        text = sentenced(path)
        with open(os.path.join(ROOT, path), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)  # the checkout's edge, not an installed one
    sys.exit(main(sys.argv[1:]))
