"""The router-CPU tier's pieces that run on the host: the guest-memory estimate and the script's
usage (the tier itself runs in .ci/run, under qemu-user)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("qledge_guest_memory",
                                               os.path.join(ROOT, "packaging", "arch", "guest_memory.py"))
assert _spec is not None and _spec.loader is not None
guest_memory = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = guest_memory  # its dataclass looks its module up
_spec.loader.exec_module(guest_memory)

QEMU = "/usr/bin/qemu-aarch64-static"


def _smaps(rows: list[tuple[int, int, str, str, int, int]]) -> str:
    """smaps text of (start, end, perms, path, Rss KiB, Anonymous KiB) rows."""
    out = []
    for start, end, perms, path, rss, anon in rows:
        out.append(f"{start:08x}-{end:08x} {perms} 00000000 fe:00 {1 if path.startswith('/') else 0}  {path}")
        out += [f"Size: {(end - start) // 1024} kB", f"Rss: {rss} kB", f"Pss: {rss} kB", f"Anonymous: {anon} kB"]
    return "\n".join(out) + "\n"


# An idle arm64 guest as the host sees it: the guest's program, its libraries and anonymous
# mappings low (guest address = host address), the emulator's heap, translation cache, binary
# and own allocations high.
ARM64 = [
    (0x400000, 0x916000, "r--p", "/srv/chroot/usr/bin/python3.11", 3000, 0),
    (0xA5F000, 0xD81000, "rw-p", "", 2900, 2900),  # the guest's brk
    (0x5500000000, 0x5500001000, "---p", "", 0, 0),
    (0x5500001000, 0x5500801000, "rw-p", "", 100, 100),  # the guest's stack (unlabelled here)
    (0x5501567000, 0x5501767000, "rw-p", "", 2000, 2000),
    (0x55558F922000, 0x55558FD9F000, "rw-p", "[heap]", 4400, 4400),
    (0x7FC94C000000, 0x7FC953FFF000, "rwxp", "", 18000, 18000),  # translation cache
    (0x7FC959EFD000, 0x7FC95A0FE000, "rw-p", "", 2000, 2000),  # the emulator's own mmap
    (0x7FC95AA00000, 0x7FC95AC28000, "r--p", QEMU, 2200, 0),
    (0x7FC95AC28000, 0x7FC95B0A7000, "r-xp", QEMU, 3100, 0),
    (0x7FFF60E35000, 0x7FFF60E56000, "rw-p", "[stack]", 40, 40),
]


def test_the_guest_is_what_lies_below_the_emulators_own_mappings():
    groups = guest_memory.classify(guest_memory.parse_maps(_smaps(ARM64)), QEMU, bits32=False)
    assert guest_memory.total(groups["guest"], "Rss") == 3000 + 2900 + 100 + 2000
    assert guest_memory.total(groups["guest"], "Anonymous") == 2900 + 100 + 2000
    assert guest_memory.total(groups["translation_cache"], "Rss") == 18000
    assert guest_memory.total(groups["emulator_binary"], "Rss") == 5300
    assert guest_memory.total(groups["emulator_heap"], "Rss") == 4400
    assert guest_memory.total(groups["emulator_other"], "Rss") == 2040  # its mmap and the host stack


def test_a_32_bit_guest_ends_at_4_gib_and_its_reserved_space_holds_nothing():
    rows = [
        (0x1000, 0x11000, "---p", "", 0, 0),
        (0x11000, 0x3D5000, "r--p", "/srv/chroot/usr/bin/python3.11", 2500, 0),
        (0x49D000, 0x50E000, "rw-p", "", 400, 400),
        (0x50E000, 0x3FCF1000, "---p", "", 0, 0),  # qemu's reservation of the guest's 4 GiB
        (0x3FCF1000, 0x3FDB5000, "rw-p", "", 700, 700),
        (0xFFFFF000, 0x100001000, "rw-p", "", 8, 8),  # straddles 4 GiB: not the guest's
        (0x55558F922000, 0x55558FD9F000, "rw-p", "[heap]", 4000, 4000),
        (0x7FC95AA00000, 0x7FC95AC28000, "r--p", QEMU, 2000, 0),
    ]
    groups = guest_memory.classify(guest_memory.parse_maps(_smaps(rows)), QEMU, bits32=True)
    assert guest_memory.total(groups["guest"], "Rss") == 2500 + 400 + 700
    assert guest_memory.total(groups["emulator_other"], "Rss") == 8


def test_natively_the_whole_process_is_the_guest():
    result = guest_memory.estimate(os.getpid(), "amd64")
    assert result["emulator"] is None
    rss = result["guest_mib"]["rss"]
    assert abs(rss - result["process"]["VmRSS"]) <= 0.5 + 0.05 * rss  # smaps and status, read apart


def test_the_tier_says_how_to_call_it():
    done = subprocess.run(["bash", os.path.join(ROOT, "packaging", "arch", "smoke.sh"), "sparc"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.startswith("usage: ") and "arm64|armhf|mipsel|amd64" in done.stderr


def test_the_bash_scripts_lint():
    import shutil

    import pytest

    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (.ci/run installs it as root)")
    for script in ("packaging/arch/smoke.sh", "openwrt/sdk-build.sh"):
        done = subprocess.run([shellcheck, "-s", "bash", os.path.join(ROOT, script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout
