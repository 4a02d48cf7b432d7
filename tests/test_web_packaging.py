"""The panel's artifacts: its zipapp profile, the systemd unit, the procd init with its UCI
options, and the LuCI app."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from support import short_tmpdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "packaging"))
import build  # noqa: E402

LUCI = os.path.join(ROOT, "openwrt", "luci-app-qledge")
UNIT = os.path.join(ROOT, "packaging", "systemd", "qledge-web.service")


def read(*parts: str) -> str:
    with open(os.path.join(*parts), encoding="utf-8") as f:
        return f.read()


def test_the_web_profile_is_edge_plus_the_panel_and_edge_is_unchanged():
    edge, web = build.profile_files("edge"), build.profile_files("web")
    assert not [f for f in edge if f.startswith("edge/web/")]
    # Beside the panel, only what the smallest build leaves out (doctor, completion) and every other has.
    assert sorted(set(web) - set(edge)) == sorted(
        f for f in web if f.startswith("edge/web/") or f in build.NOT_IN_EDGE)
    assert "edge/web/static/app.js" in web and "edge/web/command.py" in web
    assert set(edge) <= set(web)


def test_the_web_zipapp_serves_its_assets(daemon):
    out = short_tmpdir()
    try:
        assert subprocess.run([sys.executable, os.path.join(ROOT, "packaging", "build.py"), "--profile", "web",
                               "--out", out], capture_output=True, timeout=120).returncode == 0
        pyz = os.path.join(out, "qledge-web.pyz")
        with zipfile.ZipFile(pyz) as zf:
            assert "edge/web/static/index.html" in zf.namelist()
        from web_support import WebProcess

        web = WebProcess(daemon, python=sys.executable, env={"PYTHONPATH": pyz})
        try:
            status, headers, body = web.request("GET", "/static/strings.js")
            assert status == 200 and "登录" in body.decode()  # from inside the archive
        finally:
            web.stop()
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it)")
    return path


def test_the_units_sandbox_verifies_and_scores_low(tmp_path):
    unit = tmp_path / "qledge-web.service"
    unit.write_text(read(UNIT).replace("/opt/qledge/bin/qledge", "/bin/true"))
    verify = subprocess.run([_tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0 and "qledge-web.service" not in verify.stderr, verify.stderr
    security = subprocess.run([_tool("systemd-analyze"), "security", "--offline=yes", "--threshold=20", str(unit)],
                              capture_output=True, text=True)
    assert security.returncode == 0, security.stdout[-1500:]
    text = read(UNIT)
    assert "--listen 127.0.0.1:5700" in text and "DynamicUser=yes" in text


def test_the_init_script_lints_and_the_panel_is_off_by_default():
    init = os.path.join(LUCI, "root", "etc", "init.d", "qledge-web")
    result = subprocess.run([_tool("shellcheck"), "-s", "sh", init], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert os.access(init, os.X_OK)
    config = read(LUCI, "root", "etc", "config", "qledge-web")
    assert "option enabled '0'" in config and "option listen '127.0.0.1'" in config
    script = read(init)
    for option in ("listen", "port", "tls_cert", "tls_key", "origin", "luci_origin", "allow_host", "session_idle",
                   "session_max"):
        assert f"'{option}:" in script and option in config, option  # validated, and documented in the config


def test_the_luci_menu_acl_and_view_agree():
    menu = json.loads(read(LUCI, "root", "usr", "share", "luci", "menu.d", "luci-app-qledge.json"))
    acl = json.loads(read(LUCI, "root", "usr", "share", "rpcd", "acl.d", "luci-app-qledge.json"))
    entry = menu["admin/services/qledge"]
    view = os.path.join(LUCI, "htdocs", "luci-static", "resources", "view", entry["action"]["path"] + ".js")
    assert os.path.exists(view)
    assert entry["depends"]["acl"] == list(acl)
    assert acl["luci-app-qledge"]["read"]["ubus"] == {"service": ["list"]}
    assert "write" not in acl["luci-app-qledge"]  # LuCI only shows status; the panel does the rest
    source = read(view)
    assert "'require view'" in source and "callServiceList('qledge')" in source


# LuCI runs a view's file as the body of a function (its 'require' lines load view, rpc and
# uci); this stands in for those and for E() and _(), enough to render the view in node.
LUCI_STUB = r"""
const fs = require('fs');
const [source, config] = [fs.readFileSync(process.argv[2], 'utf8'), JSON.parse(process.argv[3])];
const E = (tag, attrs, children) => ({tag, attrs: attrs || {}, children: [].concat(children || [])});
const stubs = {
  view: {extend: (o) => o},
  rpc: {declare: () => () => Promise.resolve({})},
  uci: {load: () => Promise.resolve(), get: (c, s, o) => (c === 'qledge-web' && s === 'main') ? config[o] : undefined},
  E, _: (s) => s, window: {location: {hostname: 'router.lan'}},
};
const view = new Function(...Object.keys(stubs), source)(...Object.values(stubs));
const up = {instances: {i: {running: true}}};
const tree = view.render([{qledge: up}, {'qledge-web': up}]);
const links = [];
(function walk(n) { if (n && n.tag) { if (n.tag === 'a') links.push(n.attrs.href); n.children.forEach(walk); } })(tree);
process.stdout.write(JSON.stringify(links));
"""


@pytest.mark.parametrize("config, links", [
    ({"listen": "127.0.0.1"}, []),  # this router only: no link, a sentence saying how to open it
    ({"listen": "0.0.0.0", "port": "5700"}, ["http://router.lan:5700/"]),
    ({"listen": "0.0.0.0", "port": "5701", "tls_cert": "/etc/qledge/web.crt"}, ["https://router.lan:5701/"]),
    ({"listen": "127.0.0.1", "origin": "https://router.lan"}, ["https://router.lan/"]),  # behind a reverse proxy
    ({"listen": "0.0.0.0", "port": "5700", "origin": "https://qledge.example:8443/"}, ["https://qledge.example:8443/"]),
])
def test_the_luci_view_opens_the_panel_where_its_config_says(tmp_path, config, links):
    view = os.path.join(LUCI, "htdocs", "luci-static", "resources", "view", "qledge", "panel.js")
    stub = tmp_path / "render.js"
    stub.write_text(LUCI_STUB)
    result = subprocess.run([_tool("node"), str(stub), view, json.dumps(config)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == links
