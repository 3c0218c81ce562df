"""The committed generated code is exactly what scripts/gen_protos.py writes from protos/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_fresh(tmp_path):
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in _load_generator().generate(tmp_path)}
    committed = {p.relative_to(ROOT): p.read_bytes() for p in sorted((ROOT / "splice" / "v1").glob("*_pb2*.py*"))}
    assert sorted(fresh) == sorted(committed), "generated file set differs: run python scripts/gen_protos.py"
    stale = [str(name) for name, data in fresh.items() if committed[name] != data]
    assert not stale, f"stale generated code {stale}: run python scripts/gen_protos.py"
