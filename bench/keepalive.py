"""The keep-alive row of bench/tunnel.py: requests per second and latency with
--connections kept-alive connections, measured by wrk (a load generator we did
not write) against the direct port, two bare Python relays to the service
(bench/python_floor.py) and the tunnel, in turn.

wrk runs closed-loop: each connection sends its next request as soon as the
last answer arrives, so the figures are at saturation and a path that answers
fewer requests a second also shows a longer latency. The added latency is the
tunnel's percentile minus the direct path's, per percentile.
"""

from __future__ import annotations

import re
import shutil
import subprocess

_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}
_PERCENTILE = re.compile(r"^\s*(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_ERRORS = re.compile(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)")


def have_wrk() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("bench/tunnel.py needs wrk: run `bash scripts/build-bench-images.sh` (or `make bench`)")


def run_wrk(url: str, connections: int, seconds: int) -> dict[str, float]:
    """{"rps", "p50", "p99"} of one wrk run (latencies in ms); raises when any
    request failed, so a figure never hides errors."""
    done = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    )
    errors = _ERRORS.findall(done.stdout)
    if errors:
        raise RuntimeError(f"wrk saw failed requests on {url}:\n{done.stdout}")
    figures = {"rps": float(_RATE.search(done.stdout).group(1))}  # type: ignore[union-attr]
    for percentile, value, unit in _PERCENTILE.findall(done.stdout):
        figures[f"p{percentile}"] = float(value) * _UNITS_MS[unit]
    return figures


def measure(paths: dict[str, str], connections: int, seconds: int, runs: int) -> dict[str, list[dict]]:
    """wrk on each path (name -> URL), alternating, `runs` times each."""
    results: dict[str, list[dict]] = {name: [] for name in paths}
    for _ in range(runs):
        for name, url in paths.items():
            results[name].append(run_wrk(url, connections, seconds))
    return results


def report(results: dict[str, list[dict]], connections: int, seconds: int) -> None:
    def median(name: str, key: str) -> float:
        values = sorted(run[key] for run in results[name])
        return values[len(values) // 2]

    print(f"\n{connections} keep-alive connections (wrk, {seconds} s a run, median of {len(results['direct'])} runs)")
    print(f"{'path':8} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for name in results:
        print(f"{name:8} {median(name, 'rps'):10.0f} {median(name, 'p50'):8.2f} {median(name, 'p99'):8.2f}")
    added_p50 = median("tunnel", "p50") - median("direct", "p50")
    added_p99 = median("tunnel", "p99") - median("direct", "p99")
    ratio = median("tunnel", "rps") / median("direct", "rps")
    print(f"tunnel/direct requests a second {ratio:.2f}; added at p50 {added_p50:.2f} ms, p99 {added_p99:.2f} ms")
    if "floor" in results:
        direct, floor = median("direct", "rps"), median("floor", "rps")
        print(f"two bare Python relays/direct {floor / direct:.2f}; tunnel/relays {ratio * direct / floor:.2f}")
        floor_added = median("floor", "p50") - median("direct", "p50")
        print(f"two bare Python relays add at p50 {floor_added:.2f} ms")
    # wrk is closed-loop: each connection sends its next request when the last
    # is answered, so at saturation a request's latency is the connections over
    # the rate (Little's law), and the p50 added follows the rate.
    queued = ", ".join(f"{name} {1000 * connections / median(name, 'rps'):.2f}" for name in results)
    print(f"(goal: under 2 ms added at p50; connections / rate, ms: {queued})")
