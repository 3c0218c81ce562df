"""`splice --help` and `--version` as a new user meets them: every default stated once, never "(default: None)",
no torch on the way, the installed version."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version

from app.cli import build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_with_a_default_states_it_once():
    commands = _subparsers(build_parser())
    assert {"engine", "preprocessor", "up", "chat", "demo", "build-tiny"} <= set(commands)
    for name, parser in commands.items():
        formatter = parser._get_formatter()
        text = parser.format_help()
        assert "(default: None)" not in text and "default: None" not in text, (name, text)
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            default = action.default
            if default is None or default is False or default in ("", [], argparse.SUPPRESS):
                continue
            helped = formatter._expand_help(action)
            flag = f"splice {name} {action.option_strings[-1]}"
            assert helped.count("default") == 1, (flag, helped)
            assert str(default) in helped or f"{default:g}" in helped, (flag, default, helped)


def test_version_is_the_installed_distributions():
    out = subprocess.run([sys.executable, "-m", "app.cli", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"splice {version('splice')}"


def test_help_imports_neither_torch_nor_transformers():
    # every subcommand's --help, as the user's process runs it; what it imported is read back after
    code = ("import sys\nfrom app.cli import main\n"
            "for argv in ([], ['engine'], ['preprocessor'], ['up'], ['chat'], ['demo'], ['build-tiny']):\n"
            "    try:\n        main([*argv, '--help'])\n    except SystemExit:\n        pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout[-300:]


def test_splice_up_passes_served_model_names_to_the_preprocessor():
    """vLLM's --served-model-name on `splice up`: the preprocessor serves the names (tests/integration/
    test_vllm_meaning.py holds what it then does)."""
    from app.cli import preprocessor_flags

    args = build_parser().parse_args(["up", "--served-model-name", "a", "b", "--tool-call-parser", "hermes"])
    flags = preprocessor_flags(args)
    assert flags[flags.index("--served-model-name"):][:3] == ["--served-model-name", "a", "b"]
    preprocessor = build_parser().parse_args(["preprocessor", *flags])
    assert preprocessor.served_model_name == ["a", "b"] and preprocessor.tool_call_parser == "hermes"
    assert "--served-model-name" not in preprocessor_flags(build_parser().parse_args(["up"]))
