"""Is the system clock synchronised? Asked of the kernel, which knows.

Rental start and end times, logs and TLS all depend on the host's clock. The
kernel's NTP state (adjtimex) says whether chrony, ntpd or timesyncd keeps it
in step, without depending on which one is installed. The skew against the
marketplace's own clock is measured separately, from its serverTime.
"""

from __future__ import annotations

import ctypes
import ctypes.util

TIME_ERROR = 5  # adjtimex's return value when the clock is not synchronised
STA_UNSYNC = 0x0040


class _Timex(ctypes.Structure):
    # struct timex from <sys/timex.h> (Linux, 64-bit longs); the tail is padding.
    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time_sec", ctypes.c_long),
        ("time_usec", ctypes.c_long),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("padding", ctypes.c_int * 11),
    ]


def kernel_clock_state() -> dict:
    """{"synchronized": bool | None, "maxErrorMs": float | None, "source": ...}.
    None means the kernel could not be asked (not Linux, or no libc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        timex = _Timex()  # modes 0: read only
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError):
        return {"synchronized": None, "maxErrorMs": None, "source": "unavailable"}
    if state < 0:
        return {"synchronized": None, "maxErrorMs": None, "source": "unavailable"}
    synced = state != TIME_ERROR and not timex.status & STA_UNSYNC
    return {"synchronized": synced, "maxErrorMs": round(timex.maxerror / 1000, 1), "source": "adjtimex"}
