"""An image whose configuration is written by hand, as a registry would serve
one pushed with a hand-written config: `docker build` refuses a negative
healthcheck interval or a 20 MB STOPSIGNAL, the engine loads and runs them
from an image all the same.

The test image is saved (`docker save`: its layers, its config JSON and a
manifest naming both), its config edited, and the archive loaded back under
a new tag. Local only: no registry, no network.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable


def load_with_config(docker_client, base: str, tag: str, edit: Callable[[dict], None]) -> None:
    """`tag`: `base` with its `config` object edited by `edit` (in place)."""
    saved = io.BytesIO(b"".join(docker_client.images.get(base).save(named=True)))
    out = io.BytesIO()
    with tarfile.open(fileobj=saved) as source, tarfile.open(fileobj=out, mode="w") as target:
        members = {member.name: member for member in source.getmembers()}
        manifest = json.load(source.extractfile(members["manifest.json"]))  # type: ignore[arg-type]
        image = json.load(source.extractfile(members[manifest[0]["Config"]]))  # type: ignore[arg-type]
        edit(image["config"])
        config = json.dumps(image).encode()
        manifest[0]["Config"] = f"{hashlib.sha256(config).hexdigest()}.json"
        manifest[0]["RepoTags"] = [tag]
        for name, member in members.items():
            if name.endswith(".json") and "/" not in name or name == "repositories":
                continue  # the old config, the manifest, the old tag: written anew below
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
        for name, data in ((manifest[0]["Config"], config), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            target.addfile(info, io.BytesIO(data))
    docker_client.images.load(out.getvalue())
