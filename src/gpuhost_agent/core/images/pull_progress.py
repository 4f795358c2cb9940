"""What a pull has done so far, folded from the engine's JSON events, as a
renter reads it: `image 'x': 120.0 of 450.0 MB, 2 of 5 layers`.

The engine (`POST /images/create`, what `docker pull` shows) sends one event
per layer change: `Pulling fs layer`, `Waiting`, `Downloading` with
`progressDetail` {current, total}, `Download complete`, `Extracting` with
its own {current, total}, `Pull complete`, or `Already exists` for a layer
the host has. The fold keeps one small record per layer (an image has tens
of layers, so memory stays bounded by the image, never by the events) and
a progress mark that grows only when bytes move: the stall guard
(runtime/image_pull.py) compares marks, so events that repeat without a
byte (a `Waiting`, a `Retrying in 5 seconds`) do not count as progress.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuhost_agent.runtime.engine.records import PullEvent

MB = 1000 * 1000  # as `docker pull` counts
MAX_LAYERS = 1000  # the engine refuses more than 128; ids past this are not recorded


@dataclass
class Layer:
    total: int = 0  # compressed size, once a Downloading event said it
    downloaded: int = 0
    extracted: int = 0
    fetched: bool = False  # downloaded in full (or already here)
    done: bool = False  # extracted (or already here)


@dataclass
class PullProgress:
    image: str
    layers: dict[str, Layer] = field(default_factory=dict)
    error: str = ""  # the engine's own message, when it sent one
    waiting: bool = False  # queued: not started, for want of a pull slot (pull_slots.py)

    def add(self, event: PullEvent) -> None:
        """Fold one event of the engine's stream in."""
        if not isinstance(event, dict):  # the stream's lines are untrusted: not every one is an object
            return
        if event.get("error"):
            self.error = str(event["error"])[:500]
            return
        status, layer_id = str(event.get("status") or ""), event.get("id")
        if not isinstance(layer_id, str) or not layer_id or status.startswith(("Pulling from", "Digest:", "Status:")):
            return
        layer = self.layers.get(layer_id)
        if layer is None:
            if len(self.layers) >= MAX_LAYERS:
                return
            layer = self.layers[layer_id] = Layer()
        detail = event.get("progressDetail") or {}
        current, total = _number(detail.get("current")), _number(detail.get("total"))
        if status == "Downloading":
            layer.downloaded = max(layer.downloaded, current)
            layer.total = max(layer.total, total)
        elif status in ("Download complete", "Verifying Checksum"):
            layer.fetched = True
        elif status == "Extracting":
            layer.fetched = True
            layer.extracted = max(layer.extracted, current)
        elif status == "Pull complete":
            layer.fetched = layer.done = True
        elif status == "Already exists":
            layer.fetched = layer.done = True

    @property
    def total_bytes(self) -> int:
        return sum(layer.total for layer in self.layers.values())

    @property
    def fetched_bytes(self) -> int:
        return sum(layer.total if layer.fetched and layer.total else layer.downloaded for layer in self.layers.values())

    @property
    def layers_done(self) -> int:
        return sum(1 for layer in self.layers.values() if layer.done)

    def mark(self) -> tuple[int, int, int]:
        """Grows exactly when the pull moved: bytes fetched, bytes unpacked, layers done."""
        extracted = sum(layer.extracted for layer in self.layers.values())
        return self.fetched_bytes, extracted, self.layers_done

    def text(self) -> str:
        """`image 'x': 120.0 of 450.0 MB, 2 of 5 layers` (the total counts the
        layers whose size the engine said so far; `starting` before any)."""
        if self.waiting:
            return f"image {self.image!r}: waiting for a pull slot"
        if not self.layers:
            return f"image {self.image!r}: starting"
        return (
            f"image {self.image!r}: {self.fetched_bytes / MB:.1f} of {self.total_bytes / MB:.1f} MB, "
            f"{self.layers_done} of {len(self.layers)} layers"
        )


def _number(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


MAX_MESSAGE = 1000  # characters of the renter's progress message


def progress_message(pulls: list[PullProgress]) -> str:
    """The APPLYING message while the stack's images are pulled."""
    text = "pulling " + "; ".join(pull.text() for pull in pulls)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
