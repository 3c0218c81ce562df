"""The README and docs/ as a user meets them: every link leads somewhere, every bash block parses, every `splice`
command in it is one the CLI takes, every module and script it runs exists, every service flag is documented.
The runnable blocks run against a live stack in tests/integration/test_docs_examples.py."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from app.cli import build_parser
from tests.docs_blocks import DOCS, ROOT, all_blocks, commands, prose

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
BASH = all_blocks("bash")
PYTHON = all_blocks("python")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose(doc).splitlines():
        if heading := re.match(r"^#{1,6}\s+(.*)$", line):
            slug = _slug(heading.group(1))
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


README_LINES = 250  # the README is read whole; what does not fit goes to docs/


def test_the_readme_fits():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_LINES


def test_the_docs_are_where_the_readme_says():
    names = {d.relative_to(ROOT).as_posix() for d in DOCS}
    assert {"README.md", "docs/operations.md", "docs/api.md", "docs/engine.md", "docs/architecture.md",
            "docs/performance.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_relative_link_leads_to_a_file_and_section(doc):
    for target in LINK.findall(prose(doc)):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        assert file.exists() and file.is_relative_to(ROOT), f"{doc.name}: link to a missing file: {target}"
        if anchor:
            assert file.suffix == ".md", f"{doc.name}: anchor into a non-markdown file: {target}"
            assert anchor in _anchors(file), f"{doc.name}: no section #{anchor} in {file.name}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_nothing_points_outside_the_repository_and_the_cli_has_one_spelling(doc):
    text = doc.read_text()
    assert "../shared" not in text and "shared/tools" not in text, doc.name  # users have only this repository
    assert ".venv/bin/splice" not in text, f"{doc.name}: the CLI is `splice` (venv active), one spelling"


@pytest.mark.parametrize("block", BASH, ids=lambda b: b.where)
def test_every_bash_block_parses(block):
    out = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"{block.where}: {out.stderr}"


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.where)
def test_every_python_block_compiles(block):
    compile(block.text, block.where, "exec")


def _argv_checks(block) -> list[str]:
    """What is wrong with the block's commands: a `splice` command the CLI refuses, a `python -m` module or a
    script that does not exist."""
    problems = []
    for argv in commands(block.text):
        name = Path(argv[0]).name
        if name == "splice":
            try:
                build_parser().parse_args(argv[1:])
            except SystemExit as exc:
                if exc.code:
                    problems.append(f"`{' '.join(argv)}`: the CLI refuses it")
        elif name in ("python", "python3") and len(argv) > 2 and argv[1] == "-m":
            if importlib.util.find_spec(argv[2]) is None:
                problems.append(f"`{' '.join(argv)}`: no module {argv[2]}")
        elif (name in ("python", "python3", "bash") and len(argv) > 1 and argv[1].endswith((".py", ".sh"))
              and not (ROOT / argv[1]).exists()):
            problems.append(f"`{' '.join(argv)}`: no file {argv[1]}")
    return problems


@pytest.mark.parametrize("block", BASH, ids=lambda b: b.where)
def test_every_command_names_a_real_flag_module_or_script(block, capsys):
    problems = _argv_checks(block)
    assert not problems, f"{block.where}: {problems}\n{capsys.readouterr().err}"


def test_the_command_checks_catch_a_stale_block():
    from tests.docs_blocks import Block

    stale = Block(ROOT / "README.md", 1, "bash", "splice up --no-such-flag\npython -m bench.no_such_bench\n"
                  "bash scripts/no_such.sh\n", False)
    assert len(_argv_checks(stale)) == 3


def test_the_command_splitter_reads_continuations_quotes_and_operators():
    script = ('FOO=1 splice up --engine-args "--a 1" &  splice chat hi \\\n  --max-tokens 4 # note\n'
              'python -c "\nprint(1)" | grep 1\n')
    assert commands(script) == [["splice", "up", "--engine-args", "--a 1"],
                                ["splice", "chat", "hi", "--max-tokens", "4"],
                                ["python", "-c", "\nprint(1)"], ["grep", "1"]]


@pytest.mark.parametrize("service", ["engine", "preprocessor"])
def test_every_service_flag_is_in_the_configuration_docs(service):
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {f for a in sub.choices[service]._actions for f in a.option_strings if f.startswith("--")} - {"--help"}
    documented = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(f for f in flags if f"`{f}`" not in documented)
    assert not missing, f"splice {service} flags missing from docs/operations.md: {missing}"
