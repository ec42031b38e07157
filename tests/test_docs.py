"""Docs that must stay true: the config-key table and the README's two commands."""
import re
from pathlib import Path

from fastsac.config import config_keys_markdown

REPO = Path(__file__).resolve().parents[1]


def test_design_doc_config_table_matches_the_code():
    text = (REPO / "docs" / "configuration.md").read_text()
    table = re.search(r"<!-- CONFIG-KEYS:BEGIN -->\n(.*?)\n<!-- CONFIG-KEYS:END -->", text, re.S)
    assert table, "docs/configuration.md lost its config-key table markers"
    assert table.group(1).strip() == config_keys_markdown().strip(), \
        "config keys changed: regenerate the table with `python -m fastsac.config`"


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"```sh\n(scripts/\S+\.sh[^\n]*)\n```", readme)
    assert commands[:2] == ["scripts/train.sh configs/quickstart.yaml", "scripts/test.sh"]
    ci = (REPO / ".ci" / "run").read_text()
    # the README's two commands, in the README's order: the tests pass after a training run
    assert "scripts/train.sh configs/quickstart.yaml" in ci and "scripts/test.sh" in ci
    assert ci.index("scripts/train.sh configs/quickstart.yaml") < ci.index("scripts/test.sh"), ci
