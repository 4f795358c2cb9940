"""doctor's view of the settings in effect: each setting's value and where it
came from (flag, environment, file, default), the keys never shown."""

from __future__ import annotations

from gpuhost_agent.service.config import DEFAULT, UNSET, AgentConfig, Chosen
from gpuhost_agent.service.settings import Setting, SwarmRole
from gpuhost_agent.service.settings_table import SETTINGS

MASK = "***"
FROM_KEY_FILE = "key file"


def _shown(value: object) -> str:
    """An effective value as a host would write it."""
    if value is None:
        return "unset"
    if isinstance(value, SwarmRole):
        return value.value or "off"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, dict):
        return ",".join(f"{node}={_shown(address)}" for node, address in value.items()) or "none"
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
        return f"{value[0]}:{value[1]}"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def _row(setting: Setting, chosen: Chosen, config: AgentConfig) -> dict[str, str]:
    effective = getattr(config, setting.field) if setting.field else chosen.text
    source = chosen.source
    if setting.secret:  # whether it is set, and from where: never its value
        if effective and chosen.text is None:
            source = FROM_KEY_FILE
        return {"setting": setting.env, "value": MASK if effective else "unset", "source": source}
    if setting.fills or not setting.field:  # the text as written (a size, a file's path), not a converted value
        value = chosen.text if chosen.text is not None else "unset"
    else:
        value = _shown(effective)
        if source == UNSET and effective is not None:  # computed at start (the status socket)
            source = DEFAULT
    if value == "unset" and setting.shown_default:  # left to the agent: say what it does then
        value = f"unset: {setting.shown_default}"
    return {"setting": setting.env, "value": value, "source": source}


def effective(chosen: dict[str, Chosen], config: AgentConfig) -> list[dict[str, str]]:
    """One row per setting, in the table's order."""
    return [_row(setting, chosen[setting.name], config) for setting in SETTINGS]


def lines(rows: list[dict[str, str]], whose: str = "") -> str:
    """The rows under a title; `whose`: which process's settings they are, said first."""
    width = max(len(row["setting"]) for row in rows)
    out = [f"{whose or 'effective settings'} (value, and where it came from: flag, environment, file or default):"]
    out += [
        f"  {row['setting']:<{width}}  {row['value']}" + ("" if row["source"] == UNSET else f"  ({row['source']})")
        for row in rows
    ]
    return "\n".join(out)
