"""The README's Quick start as a new user follows it, and `.ci/run` on a machine whose Python
cannot make a virtualenv yet (stand-ins for python3 and apt-get, the real script)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _section(title: str) -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index(f"## {title}\n")
    return text[start: text.index("\n## ", start + 1)]


def test_quick_start_is_two_set_up_commands_and_the_second_terminal():
    blocks = re.findall(r"```sh\n(.*?)```", _section("Quick start"), re.S)
    assert blocks == [
        "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/qledge serve\n",  # installs and runs
        ". .venv/bin/activate\n",  # the second terminal
        "bash .ci/run\n",  # installs and passes the tests
    ]
    walk = _section("Walk-through")
    # The walk-through shows what `qledge status` prints, not just the command.
    status = walk[walk.index("$ qledge status\n"):]
    assert re.search(r"^qledge: +\S+ \(pid \d+, up ", status, re.M) and "scheduler:" in status


def _stub_bin(tmp_path, apt_helps: bool) -> str:
    """python3 that cannot make a virtualenv until the fake apt-get has installed python3-venv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker, calls = tmp_path / "venv-installed", tmp_path / "apt-calls"
    (bin_dir / "python3").write_text(f"""#!/bin/sh
case "$*" in
  *"import venv, ensurepip"*) [ -e {marker} ] && exit 0; exit 1;;
  *"-m venv"*) echo "venv made" >> {calls}; exit 42;;
  *) exec {sys.executable} "$@";;
esac
""")
    install = f"touch {marker}" if apt_helps else "true"
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in *install*python3-venv*) {install};; esac
exit 0
""")
    for name in ("python3", "apt-get"):
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root installs python3-venv; elsewhere .ci/run says what to install")
@pytest.mark.parametrize("apt_helps", [True, False])
def test_ci_run_installs_python3_venv_when_missing(tmp_path, apt_helps):
    bin_dir = _stub_bin(tmp_path, apt_helps)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": f"{bin_dir}/python3"}
    done = subprocess.run(["bash", os.path.join(ROOT, ".ci", "run")], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    calls = (tmp_path / "apt-calls").read_text().splitlines()
    assert any("install" in c and "python3-venv" in c for c in calls), calls
    if apt_helps:  # then the virtualenv is made (the stand-in stops the run right there)
        assert calls[-1] == "venv made" and done.returncode == 42
    else:
        assert "venv made" not in calls and done.returncode == 1
        assert done.stderr.strip().endswith("cannot create a virtualenv: install python3-venv"
                                            " (apt-get install python3-venv)")
