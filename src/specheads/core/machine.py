"""What this machine's CPU is, as Linux's /proc/cpuinfo says: read by the calibration cache (its key names
the processor), the optimizer (whether bf16 products are fast), the benchmarks (what their JSON records) and
.ci/run (what it prints of the machine)."""

from __future__ import annotations

import platform

CPUINFO = "/proc/cpuinfo"


def cpuinfo_field(name: str, cpuinfo: str = CPUINFO) -> str | None:
    """The first processor's `name` field in `cpuinfo` ("model name", "flags", ...), None where the file or
    the field is missing (macOS, Windows)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def processor_name(cpuinfo: str = CPUINFO) -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    return cpuinfo_field("model name", cpuinfo) or platform.processor() or platform.machine()
