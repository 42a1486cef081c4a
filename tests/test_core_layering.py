"""The pure core (``broker/core/``) imports nothing from the shells, the config, the CLI or the
simulator: what it needs of theirs (durations, AWS settings) lives in the core or stays out."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "broker" / "core"
OUTSIDE = ("broker.config", "broker.shells", "broker.cli", "broker.sim")


def _imported(source: str, package: list[str]) -> list[str]:
    """Absolute names of the modules ``source`` (a module of ``package``) imports."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return names


def test_core_imports_nothing_from_config_or_shells():
    offending = sorted(
        f"{path.relative_to(CORE.parent.parent)}: {name}"
        for path in CORE.rglob("*.py")
        for name in _imported(path.read_text(), ["broker", *path.relative_to(CORE.parent).parent.parts])
        if name.startswith(OUTSIDE)
    )
    assert offending == []


def test_the_layering_check_sees_relative_imports():
    """``from ...config import x`` in ``broker/core/plan/`` is an import of ``broker.config``."""
    source = "from ...config.durations import format_duration\nfrom ..units import parse_duration\n"
    names = _imported(source, ["broker", "core", "plan"])
    assert "broker.config.durations" in names
    assert "broker.core.units" in names
