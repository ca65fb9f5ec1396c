"""This process's memory as Linux counts it, for the benches that measure a step's peak: a `/proc/self/status`
line, and the high-water mark reset to the resident size."""

from __future__ import annotations

from pathlib import Path


def status_kib(field: str) -> int | None:
    """A `/proc/self/status` memory line (VmHWM, VmRSS) in KiB; None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak() -> bool:
    """Set VmHWM back to the resident size now (Linux ≥ 4.0); False where that cannot be done."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True
