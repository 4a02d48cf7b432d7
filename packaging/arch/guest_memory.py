#!/usr/bin/env python3
"""The memory of a process under qemu-user, for the guest alone.

    python3 guest_memory.py [--arch A] [--idle-s N] PID [--probe -- GUEST_PYTHON...]

Under qemu-user the kernel sees one process: the emulator, with the guest inside its address
space. Its VmHWM and VmRSS count the emulator's own memory too (its binary, its heap, the
translation cache of generated host code, its other allocations), which is most of it for a
small guest: an idle arm64 daemon shows ~75 MiB VmHWM. What a real CPU would hold is the
guest's mappings, which qemu places in the guest's address space (for these guests at host
address = guest address, below the emulator's own binary and heap; a 32-bit guest's all lie
below 4 GiB). So, from /proc/PID/smaps (the host's view):

- the emulator: the mappings of its binary (/proc/PID/exe), its [heap], the anonymous rwx
  mapping of the translation cache, the host's [stack]/[vdso]/[vvar], and every mapping at or
  above the lowest of its binary and heap (its own mmap allocations);
- the guest: every mapping below that (and below 4 GiB on a 32-bit guest).

The guest's Rss, Anonymous and Pss summed over its mappings are its VmRSS, RssAnon and PSS on
a real CPU of the same page size, up to pages the emulator merely read (it reads a guest
library's code to translate it, where a real CPU executes it: resident either way).

--probe checks the rule: it starts the given guest Python, which prints its own
/proc/self/maps (qemu answers that with the guest's view: guest addresses, guest mappings
only), and compares that with what the rule picks from the host's view of the same process.

Natively (no emulator), the whole process is the guest, and the figures are the process's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

KiB = 1024
MiB = 1 << 20
FOUR_GIB = 1 << 32
HOST_LABELS = ("[stack]", "[vdso]", "[vvar]", "[vvar_vclock]", "[vsyscall]")
THIRTY_TWO_BIT = {"armhf", "armel", "mipsel", "mips", "i386"}
LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) \S+ \d+\s*(.*)$")


@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str
    kib: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.end - self.start


def parse_maps(text: str) -> list[Mapping]:
    """/proc/PID/maps or smaps: the mappings, with smaps' per-mapping counters in KiB."""
    found: list[Mapping] = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            start, end, perms, offset, path = match.groups()
            found.append(Mapping(int(start, 16), int(end, 16), perms, int(offset, 16), path.strip()))
        elif found and line.endswith(" kB"):
            key, _, value = line.partition(":")
            found[-1].kib[key.strip()] = int(value.split()[0])
    return found


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def emulator_of(pid: int) -> str | None:
    exe = os.path.realpath(f"/proc/{pid}/exe")
    return exe if os.path.basename(exe).startswith("qemu-") else None


def classify(maps: list[Mapping], emulator: str | None, bits32: bool) -> dict[str, list[Mapping]]:
    """Each mapping as guest, translation cache, emulator binary, emulator heap or emulator other."""
    groups: dict[str, list[Mapping]] = {k: [] for k in ("guest", "translation_cache", "emulator_binary",
                                                       "emulator_heap", "emulator_other")}
    if emulator is None:
        groups["guest"] = list(maps)
        return groups
    own = [m.start for m in maps if m.path == emulator or m.path == "[heap]"]
    floor = min(own) if own else 1 << 64
    for m in maps:
        if m.path == emulator:
            groups["emulator_binary"].append(m)
        elif m.path == "[heap]":
            groups["emulator_heap"].append(m)
        elif not m.path and m.perms.startswith("rwx"):
            groups["translation_cache"].append(m)
        elif m.path in HOST_LABELS or m.end > floor or (bits32 and m.end > FOUR_GIB):
            groups["emulator_other"].append(m)
        else:
            groups["guest"].append(m)
    return groups


def total(maps: list[Mapping], key: str) -> int:
    return sum(m.kib.get(key, 0) for m in maps)


def mib(kib: int) -> float:
    return round(kib * KiB / MiB, 2)


def status(pid: int) -> dict[str, float]:
    values = {}
    for line in read(f"/proc/{pid}/status").splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            values[key] = mib(int(rest.split()[0]))
    return values


def estimate(pid: int, arch: str) -> dict[str, object]:
    emulator = emulator_of(pid)
    groups = classify(parse_maps(read(f"/proc/{pid}/smaps")), emulator, arch in THIRTY_TWO_BIT)
    guest = groups["guest"]
    return {
        "arch": arch,
        "emulator": emulator and os.path.basename(emulator),
        "process": status(pid),  # the kernel's figures: the emulator's and the guest's together
        "guest_mib": {"rss": mib(total(guest, "Rss")), "anonymous": mib(total(guest, "Anonymous")),
                      "pss": mib(total(guest, "Pss"))},
        "emulator_rss_mib": {k: mib(total(v, "Rss")) for k, v in groups.items() if k != "guest"},
        "guest_mappings": len(guest),
    }


def _union(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _outside(ranges: list[tuple[int, int]], cover: list[tuple[int, int]]) -> int:
    """Bytes of `ranges` that `cover` does not cover (both merged)."""
    left = 0
    for start, end in ranges:
        inside = sum(max(0, min(end, e) - max(start, s)) for s, e in cover)
        left += end - start - inside
    return left


PROBE = ("import sys; sys.stdout.write(open('/proc/self/maps').read() + 'END\\n'); sys.stdout.flush(); "
         "sys.stdin.read()")


def probe(argv: list[str], arch: str) -> dict[str, object]:
    """Start a guest Python, take its own view and the host's, and compare them under the rule."""
    proc = subprocess.Popen([*argv, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            if line == "END\n":
                break
            lines.append(line)
        own = parse_maps("".join(lines))
        host = parse_maps(read(f"/proc/{proc.pid}/smaps"))
        emulator = emulator_of(proc.pid)
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(60)
    # The same file at the same offset in both views gives the guest's base address (the host
    # names it from outside the chroot: a longer path with the same end).
    bases = {h.start - m.start for m in own if m.path.startswith("/")
             for h in host if h.offset == m.offset and h.path.endswith(m.path) and h.size == m.size}
    rule = classify(host, emulator, arch in THIRTY_TWO_BIT)["guest"]
    base = bases.pop() if len(bases) == 1 else None
    result: dict[str, object] = {"guest_base": None if base is None else hex(base)}
    if base is None:
        result["match"] = False
        return result
    # Reserved address space (qemu keeps a 32-bit guest's 4 GiB as one PROT_NONE mapping)
    # holds no memory and is no guest mapping: only what is accessible is compared.
    seen = _union([(m.start + base, m.end + base) for m in own if m.perms[:3] != "---"])
    picked = _union([(m.start, m.end) for m in rule if m.perms[:3] != "---"])
    result.update({
        "guest_view_bytes": sum(e - s for s, e in seen),
        "rule_extra_bytes": _outside(picked, seen),  # picked by the rule, not the guest's
        "rule_missed_bytes": _outside(seen, picked),  # the guest's, not picked
        "all_below_4gib": all(m.end + base <= FOUR_GIB for m in own),
    })
    result["match"] = result["rule_extra_bytes"] == 0 and result["rule_missed_bytes"] == 0
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    guest_python: list[str] = []
    if "--probe" in args:
        at = args.index("--probe")
        guest_python = args[at + 1:]
        if guest_python[:1] == ["--"]:
            guest_python = guest_python[1:]
        args = args[:at]
    parser = argparse.ArgumentParser(description="A process's memory under qemu-user, for the guest alone.")
    parser.add_argument("pid", type=int)
    parser.add_argument("--arch", default=os.uname().machine)
    parser.add_argument("--idle-s", type=float, help="how long the process idled (recorded)")
    opts = parser.parse_args(args)
    result = estimate(opts.pid, opts.arch)
    if opts.idle_s is not None:
        result["idle_s"] = opts.idle_s
    if guest_python and result["emulator"]:
        result["rule_check"] = probe(guest_python, opts.arch)
    guest = result["guest_mib"]
    process = result["process"]
    assert isinstance(guest, dict) and isinstance(process, dict)
    if result["emulator"]:
        emulated = result["emulator_rss_mib"]
        assert isinstance(emulated, dict)
        print(f"guest memory ({opts.arch}): RSS {guest['rss']} / RssAnon {guest['anonymous']} / PSS {guest['pss']} MiB;"
              f" the process as the kernel counts it: VmHWM {process['VmHWM']} / VmRSS {process['VmRSS']} MiB, of"
              f" which the translation cache {emulated['translation_cache']}, the emulator's binary"
              f" {emulated['emulator_binary']}, its heap {emulated['emulator_heap']}, its other mappings"
              f" {emulated['emulator_other']} MiB")
        check = result.get("rule_check")
        if isinstance(check, dict):
            print(f"rule check against a guest's own /proc/self/maps: {'matches' if check['match'] else 'DIFFERS'}"
                  f" {json.dumps(check, sort_keys=True)}")
    else:
        print(f"memory ({opts.arch}, native): VmHWM {process['VmHWM']} / VmRSS {process['VmRSS']} / RssAnon"
              f" {process['RssAnon']} / PSS {guest['pss']} MiB")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
