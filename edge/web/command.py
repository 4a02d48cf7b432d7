"""`qledge web`: the panel's entry and composition (options, the pieces, the listener).

A separate process, one more client of the daemon's tool socket: it opens no database and
loads nothing of the daemon; what it holds is its sessions, in memory. Options are parsed
by hand, like `qledge mcp`'s: argparse, logging and msgspec would cost the panel a tenth of
its budget.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from edge import EXIT_OK, EXIT_USAGE, default_home, home_socket
from edge import EXIT_TOOL as EXIT_FAILED

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl

DEFAULT_LISTEN = "127.0.0.1:5700"  # qinglong's port, so people moving from it find the panel
USAGE = ("usage: qledge web [--listen ADDR:PORT] [--tls-cert FILE --tls-key FILE] [--origin URL]"
         " [--luci-origin URL] [--allow-host NAME]... [--session-idle MIN] [--session-max H]"
         " [--socket PATH] [--home DIR] [--config FILE]")
HELP = f"""{USAGE}

serve the web panel: tasks, schedules, runs with live logs, secrets, notifications

options:
  --listen ADDR:PORT  where to listen (default {DEFAULT_LISTEN}; 0.0.0.0:5700 or [::]:5700 for the LAN)
  --tls-cert FILE     serve HTTPS with this certificate chain (PEM) ...
  --tls-key FILE      ... and this private key (PEM)
  --origin URL        the address browsers use when a reverse proxy stands in front (https://router.lan)
  --luci-origin URL   LuCI's address, which may show the panel in a frame (http://192.168.1.1)
  --allow-host NAME   a host name the panel answers to besides IP addresses and localhost (repeatable)
  --session-idle MIN  sign out after this many idle minutes (default 30)
  --session-max H     sign out after this many hours in any case (default 12)
  --socket PATH       the daemon's tool socket ($QLEDGE_SOCKET)
  --home DIR          the daemon's state directory ($QLEDGE_HOME)
  --config FILE       take home and socket from the daemon's config file ($QLEDGE_CONFIG)"""
_VALUED = ("--listen", "--tls-cert", "--tls-key", "--origin", "--luci-origin", "--allow-host", "--session-idle",
           "--session-max", "--socket", "--home", "--config")


class Usage(Exception):
    """A problem with what `qledge web` was given: one line, exit 2."""


def parse(argv: list[str]) -> dict[str, list[str]]:
    """Option name (without --) → its values, in order; `help` when asked for."""
    options: dict[str, list[str]] = {}
    tokens = iter(argv)
    for token in tokens:
        name, eq, value = token.partition("=")
        if token in ("-h", "--help"):
            options["help"] = []
        elif name in _VALUED:
            if not eq:
                value = next(tokens, "")
            if not value:
                raise Usage(f"{name} needs a value ({USAGE})")
            options.setdefault(name[2:], []).append(value)
        elif token not in ("web", "--json"):
            raise Usage(f"unknown argument {token[:64]!r} ({USAGE})")
    for name, values in options.items():
        if len(values) > 1 and name != "allow-host":
            raise Usage(f"--{name} given twice")
    return options


def listen_address(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) < 65536 or not host:
        raise Usage(f"--listen {text!r}: give ADDR:PORT, e.g. {DEFAULT_LISTEN} or [::]:5700")
    return host.strip("[]"), int(port)


def _minutes(options: dict[str, list[str]], name: str, default_s: float, scale: float) -> float:
    if name not in options:
        return default_s
    text = options[name][0]
    try:
        value = float(text) * scale
    except ValueError:
        value = 0
    if not 1 <= value <= 7 * 86400:
        raise Usage(f"--{name} {text!r}: give a number of {'minutes' if scale == 60 else 'hours'} (at most a week)")
    return value


def tool_socket(options: dict[str, list[str]]) -> str:
    """As `qledge status` finds the daemon: --socket, $QLEDGE_SOCKET, the config's, the home's."""
    first = {name: values[0] for name, values in options.items() if values}
    path = first.get("socket") or os.environ.get("QLEDGE_SOCKET")
    home = first.get("home")
    config = first.get("config") or os.environ.get("QLEDGE_CONFIG")
    if path:
        return path
    if config:
        import tomllib

        try:
            with open(config, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise Usage(f"cannot read config {config}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise Usage(f"config {config} is not valid TOML: {exc}") from None
        home = os.path.abspath(home or os.environ.get("QLEDGE_HOME") or str(data.get("home") or default_home()))
        configured = data.get("socket")
        return configured if isinstance(configured, str) and configured else os.path.join(home, "qledge.sock")
    return home_socket("qledge.sock", home)


def _url(options: dict[str, list[str]], name: str) -> str | None:
    if name not in options:
        return None
    value = options[name][0].rstrip("/")
    scheme, sep, rest = value.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or any(c in rest for c in "/?#@ "):
        raise Usage(f"--{name} {value!r}: give an origin, scheme://host[:port], e.g. https://router.lan")
    return value


def _memory() -> int:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _read_asset(name: str) -> bytes:
    """A file of edge/web/static/, from the package or from inside a zipapp."""
    loader = __spec__.loader if __spec__ is not None else None
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static", name)
    get_data = getattr(loader, "get_data", None)
    if get_data is not None:
        return bytes(get_data(path))
    with open(path, "rb") as f:
        return f.read()


def main(argv: list[str]) -> int:
    try:
        options = parse(argv)
        if "help" in options:
            print(HELP)
            return EXIT_OK
        return serve(options)
    except Usage as exc:
        sys.stderr.write(f"qledge: invalid_argument: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def serve(options: dict[str, list[str]]) -> int:
    import edge
    from edge.web.panel import Panel, Settings, load_assets
    from edge.web.server import Listener, say
    from edge.web.sessions import IDLE_S, MAX_S, LoginLimit, Sessions
    from edge.web.wire import ToolClient

    host, port = listen_address(options.get("listen", [DEFAULT_LISTEN])[0])
    cert, key = options.get("tls-cert", [None])[0], options.get("tls-key", [None])[0]
    if (cert is None) != (key is None):
        raise Usage("--tls-cert and --tls-key go together")
    hosts = {"localhost", *(h.lower() for h in options.get("allow-host", []))}
    settings = Settings(tls=cert is not None, origin=_url(options, "origin"), frame_origin=_url(options, "luci-origin"),
                        hosts=frozenset(hosts))
    sessions = Sessions(idle_s=_minutes(options, "session-idle", IDLE_S, 60),
                        max_s=_minutes(options, "session-max", MAX_S, 3600))
    path = tool_socket(options)
    tls = _tls_context(cert, key) if cert and key else None
    try:
        assets = load_assets(_read_asset)
    except OSError as exc:
        say(f"the panel's files are missing ({exc}); is this build without the web panel?")
        return EXIT_FAILED
    panel = Panel(settings, ToolClient(path), sessions, LoginLimit(), assets, _memory, edge.__version__)
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=64)
    except OSError as exc:
        raise Usage(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    scheme = "https" if tls else "http"
    shown = f"[{host}]" if ":" in host else host
    port = sock.getsockname()[1]  # the one the kernel chose, for --listen ADDR:0
    say(f"serving the panel on {scheme}://{shown}:{port}/ for the daemon at {path}")
    if tls is None and not _loopback(host) and not (settings.origin or "").startswith("https://"):
        say("warning: plain HTTP beyond this machine: anyone on the network can read the session cookie and"
            " act as whoever signed in; give --tls-cert/--tls-key, or put a TLS reverse proxy in front")
    signal.signal(signal.SIGTERM, _stop)
    try:
        Listener(panel, sock, tls).serve_forever()
    except SystemExit:
        return EXIT_OK
    finally:
        sock.close()
    return EXIT_OK


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _tls_context(cert: str, key: str) -> ssl.SSLContext:
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise Usage(f"cannot load the TLS certificate {cert} and key {key}: {exc}") from None
    return context
