"""The SSH channel caps, without a network (streams/ssh/channels.py). End to
end with OpenSSH and asyncssh: tests/integration/test_ssh_limits.py."""

from __future__ import annotations

import pytest

from gpuhost_agent.streams.ssh.channels import FORWARD, SESSION, ChannelCaps, ChannelLedger, ChannelRefused

CAPS = ChannelCaps(sessions_per_connection=2, forwards_per_connection=3, sessions_per_rental=3, forwards_per_rental=5)


def test_per_connection_then_per_rental_and_another_rental_untouched() -> None:
    ledger = ChannelLedger(CAPS)
    one, two = ledger.connection("r1"), ledger.connection("r1")
    slots = [one.take(SESSION), one.take(SESSION)]
    with pytest.raises(ChannelRefused, match="at most 2 sessions .* per SSH connection"):
        one.take(SESSION)
    slots.append(two.take(SESSION))
    with pytest.raises(ChannelRefused, match="this rental has 3 sessions"):
        two.take(SESSION)
    other = ledger.connection("r2")
    assert other.take(SESSION) and other.take(SESSION)  # another rental has its own
    assert [two.take(FORWARD) for _ in range(3)]  # and forwards are counted apart
    slots[0].release()
    slots[0].release()  # idempotent
    assert ledger.open("r1", SESSION) == 2 and two.take(SESSION)


def test_a_connection_that_ends_gives_back_what_it_held() -> None:
    ledger = ChannelLedger(CAPS)
    one = ledger.connection("r1")
    held = [one.take(FORWARD) for _ in range(3)]
    one.close()
    assert ledger.open("r1", FORWARD) == 0 and one.open(FORWARD) == 0
    held[0].release()  # a late close of a channel changes nothing
    assert ledger.open("r1", FORWARD) == 0
    two = ledger.connection("r1")
    assert [two.take(FORWARD) for _ in range(3)]
