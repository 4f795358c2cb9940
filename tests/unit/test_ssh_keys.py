"""The user's SSH keys on the local marketplace: keys made by OpenSSH's own
ssh-keygen, as a renter makes them, registered, listed on the user, refused
with a reason when they are not public keys, and deleted; over real HTTP."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from support.openapi_check import answer, check_named

from gpuhost_agent.local_marketplace.store import Store

# RSA at 2048 bits, a size renters still use: OpenSSH's default 3072 took
# ssh-keygen up to three seconds here, and the size changes nothing the tests read.
SIZE = {"rsa": ["-b", "2048"]}


def _keygen(directory: Path, kind: str, comment: str) -> tuple[str, str]:
    """(public key line, private key text) from ssh-keygen."""
    path = directory / f"id_{kind}_{comment}"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, *SIZE.get(kind, []), "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return path.with_suffix(".pub").read_text().strip(), path.read_text()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Made once for the module: the tests only read them (an RSA key takes ssh-keygen a second)."""
    directory = tmp_path_factory.mktemp("keys")
    return {
        kind: _keygen(directory, kind, comment)
        for kind, comment in (("ed25519", "me@laptop"), ("rsa", "ci"), ("ecdsa", "spare"))
    }


async def test_keys_from_ssh_keygen_are_registered_listed_and_deleted(market, keys, local_doc) -> None:
    ed25519, rsa = keys["ed25519"][0], keys["rsa"][0]
    async with market.http.post(
        market.base_url + "/users/ssh-key",
        json={"publicKey": ed25519},
        headers={"X-API-Key": market.store.renterApiKey},
    ) as response:
        assert response.status == 200
        first = await answer(local_doc, response, "/users/ssh-key", "post")
    assert first["name"] == "me@laptop"  # the key's comment
    assert first["publicKey"].split()[:2] == ed25519.split()[:2]
    status, second = await market.call("POST", "/users/ssh-key", {"publicKey": rsa, "name": "work"})
    assert status == 200 and second["name"] == "work" and second["publicKey"].endswith(" work")

    status, me = await market.call("GET", "/users/me")
    assert status == 200
    check_named(local_doc, me, "User")
    assert [key["name"] for key in me["sshKeys"]] == ["me@laptop", "work"]

    status, _ = await market.call("DELETE", "/users/ssh-key/me@laptop")
    assert status == 204
    status, body = await market.call("DELETE", "/users/ssh-key/me@laptop")
    assert status == 404 and "me@laptop" in body["message"]
    status, me = await market.call("GET", "/users/me")
    assert [key["name"] for key in me["sshKeys"]] == ["work"]


async def test_what_is_not_a_public_key_is_refused_with_why(market, keys, tmp_path) -> None:
    public, private = keys["ed25519"]
    dsa, _ = await asyncio.to_thread(_keygen, tmp_path, "dsa", "old")
    kind, blob, _comment = public.split()
    cases = {
        "a private key": ({"publicKey": private}, "private key"),
        "garbage": ({"publicKey": "not a key at all"}, "not a usable SSH public key"),
        "a cut-off key": ({"publicKey": f"{kind} {blob[:30]}"}, "not a usable SSH public key"),
        "a type that does not match the blob": ({"publicKey": f"ssh-rsa {blob}"}, "not a usable SSH public key"),
        "two keys": ({"publicKey": public + "\n" + keys["rsa"][0]}, "one line"),
        "no key": ({"name": "x"}, "publicKey must be"),
        "a name that is not a string": ({"publicKey": public, "name": 7}, "name must be"),
        "an empty name": ({"publicKey": public, "name": "  "}, "name must be"),
        "not an object": (["ssh-ed25519"], "JSON object"),
        "a DSA key, which the agent's SSH server never takes": ({"publicKey": dsa}, "ssh-keygen -t ed25519"),
    }
    for case, (body, reason) in cases.items():
        status, answered = await market.call("POST", "/users/ssh-key", body)
        assert status == 400, case
        assert reason in answered["message"], (case, answered)
    status, me = await market.call("GET", "/users/me")
    assert me["sshKeys"] == []


async def test_the_same_key_or_name_twice_is_a_conflict(market, keys) -> None:
    public = keys["ed25519"][0]
    kind, blob, _comment = public.split()
    status, _ = await market.call("POST", "/users/ssh-key", {"publicKey": public})
    assert status == 200
    status, body = await market.call("POST", "/users/ssh-key", {"publicKey": f"{kind} {blob} other-comment"})
    assert status == 409 and "registered already" in body["message"]
    status, body = await market.call("POST", "/users/ssh-key", {"publicKey": keys["rsa"][0], "name": "me@laptop"})
    assert status == 409 and "named" in body["message"]


async def test_keys_need_the_renter_key_and_survive_a_restart(market, keys, tmp_path) -> None:
    status, _ = await market.call("POST", "/users/ssh-key", {"publicKey": keys["ecdsa"][0]}, key="wrong")
    assert status == 401
    status, _ = await market.call("POST", "/users/ssh-key", {"publicKey": keys["ecdsa"][0]})
    assert status == 200
    reloaded = await asyncio.to_thread(Store.load_or_create, tmp_path / "m.json")
    assert [key["name"] for key in reloaded.sshKeys] == ["spare"]


async def test_the_agent_reads_a_rentals_login_keys_while_it_is_active(market, keys, agent_doc) -> None:
    env_key = market.store.envApiKey
    status, _ = await market.call("POST", "/users/ssh-key", {"publicKey": keys["ed25519"][0]})
    assert status == 200
    _, rental = await market.call("POST", "/rentals", {"envId": market.store.envId})
    path = f"/agent/rentals/{rental['rentalId']}/ssh-keys"
    status, body = await market.call("GET", path, key=env_key)
    assert status == 200 and [k.split()[:2] for k in body["keys"]] == [keys["ed25519"][0].split()[:2]]
    check_named(agent_doc, body, "RentalSshKeys")
    status, _ = await market.call("GET", path)  # the renter's key is not the agent's
    assert status == 401
    status, _ = await market.call("GET", "/agent/rentals/nope/ssh-keys", key=env_key)
    assert status == 404
    status, _ = await market.call("DELETE", f"/rentals/{rental['rentalId']}")
    assert status == 200
    status, body = await market.call("GET", path, key=env_key)
    assert (status, body["keys"]) == (200, [])  # an ended rental has no way in


async def test_the_host_key_of_the_session_is_kept_with_its_own_fingerprint(market, keys, tmp_path) -> None:
    public = keys["ecdsa"][0]
    body = {"sshHostKey": public, "sshHostKeyFingerprint": "SHA256:whatever-the-agent-says"}
    status, _ = await market.call("POST", "/agent/sessions", body, key=market.store.envApiKey)
    assert status == 200
    await asyncio.to_thread((tmp_path / "host.pub").write_text, public + "\n")
    listed = await asyncio.to_thread(
        subprocess.run, ["ssh-keygen", "-l", "-f", str(tmp_path / "host.pub")], capture_output=True, text=True
    )
    kept = market.store.host["sshHostKey"]
    assert kept == {"hostKey": " ".join(public.split()[:2]), "hostKeyFingerprint": listed.stdout.split()[1]}
    status, _ = await market.call("POST", "/agent/sessions", {"sshHostKey": "not a key"}, key=market.store.envApiKey)
    assert status == 200 and market.store.host["sshHostKey"] is None
