"""docs/operations.md's settings table is the one scripts/settings-doc.py
makes from the settings' declarations: a setting added, renamed or given
another default without the doc fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuhost_agent.service import settings_doc
from gpuhost_agent.service.settings_table import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"


def test_the_docs_settings_table_is_the_declarations():
    document = DOC.read_text()
    assert settings_doc.with_table(document) == document, "run: PYTHONPATH=src python3 scripts/settings-doc.py"
    section = document[document.index(settings_doc.BEGIN) : document.index(settings_doc.END)]
    for setting in SETTINGS:
        assert f"| `{setting.env}`" in section and f"`{setting.option}`" in section, setting.env


def test_the_check_notices_a_changed_declaration(monkeypatch):
    document = DOC.read_text()
    changed = SETTINGS[5].__class__(**{**vars(SETTINGS[5]), "help": "something else"})
    monkeypatch.setattr(settings_doc, "SETTINGS", (*SETTINGS[:5], changed, *SETTINGS[6:]))
    assert settings_doc.with_table(document) != document
    with pytest.raises(ValueError, match="no"):
        settings_doc.with_table("# a document without the section\n")


def test_the_script_checks_the_doc():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "settings-doc.py"), "--check"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
