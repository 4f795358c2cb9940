"""Write the settings table of docs/operations.md from the settings' one
declaration (src/gpuhost_agent/service/settings_table.py).

    PYTHONPATH=src python3 scripts/settings-doc.py          # rewrite the table
    PYTHONPATH=src python3 scripts/settings-doc.py --check  # exit 1 when it differs

tests/unit/test_settings_doc.py makes the same check in the suite.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuhost_agent.service.settings_doc import with_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the doc is current")
    args = parser.parse_args()
    current = DOC.read_text()
    wanted = with_table(current)
    if current == wanted:
        return 0
    if args.check:
        print(f"{DOC}: the settings table differs from the declarations; run scripts/settings-doc.py", file=sys.stderr)
        return 1
    DOC.write_text(wanted)
    print(f"{DOC}: settings table written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
