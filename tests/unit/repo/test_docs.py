"""Docs that must stay true: the config-key table, the README's two commands, the fault table's tests."""
import re
from pathlib import Path

from fastsac.config import config_keys_markdown

REPO = Path(__file__).resolve().parents[3]


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


def test_every_test_the_fault_table_names_exists():
    text = (REPO / "docs" / "operations.md").read_text()
    table = text[text.index("### Fault table"):text.index("### Not covered by a test")]
    named = set(re.findall(r"\b(test_[a-z0-9_]+)", table))
    defined = {m for path in (REPO / "tests").rglob("test_*.py")
               for m in re.findall(r"^def (test_[a-z0-9_]+)", path.read_text(), re.M)}
    modules = {p.stem for p in (REPO / "tests").rglob("test_*.py")}
    missing = sorted(n for n in named if n not in defined and n not in modules)
    assert not missing, f"the fault table names tests that do not exist: {missing}"
