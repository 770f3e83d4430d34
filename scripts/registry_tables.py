"""Write the doc tables that list registry entries, from the registries themselves.

    python scripts/registry_tables.py          # rewrite every table in docs/
    python scripts/registry_tables.py --check  # exit 1 naming each table that is stale

A table is the text between ``<!-- registry: NAME -->`` and ``<!-- /registry -->`` in a
page of docs/ (NAME is a key of :data:`TABLES`). Adding a divergence, a policy loss, an
advantage estimator, an engine, a benchmark profile or a toy world and running this command
updates every page that lists them; ``tests/test_registry_tables.py`` fails while a committed table differs
from the generated one.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- registry: (\w+) -->\n)(.*?)(<!-- /registry -->)", re.S)


def _row(*cells: str) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _fields(options: type) -> str:
    """``name=default, ...`` of an options dataclass (``none`` when it has no field)."""
    parts = []
    for f in dataclasses.fields(options):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        parts.append(f"`{f.name}={default!r}`")
    return ", ".join(parts) or "none"


def divergences() -> list[str]:
    from divrl.algorithms import DIVERGENCES

    rows = [_row("name", "options", "what it is"), _row("---", "---", "---")]
    for name, spec in sorted(DIVERGENCES.items()):
        options = ", ".join(f"`{o}`" for o in spec.options) or "none"
        rows.append(_row(f"`{name}`", options, spec.summary))
    return rows


def policy_losses() -> list[str]:
    from divrl.algorithms import POLICY_LOSSES
    from divrl.algorithms.policy_loss import policy_loss_spec

    rows = [_row("name", "options (defaults)", "needs"), _row("---", "---", "---")]
    for name in sorted(POLICY_LOSSES):
        options = policy_loss_spec(name).options
        needs = [
            label
            for label, on in (
                ("proxy from logits", options.NEEDS_PROXY),
                ("selection scope", options.SCOPED_SELECTION),
                ("old log-probs", options.NEEDS_OLD_LOG_PROBS),
                ("takes token weights", "token_weights" in options.INPUTS),
            )
            if on
        ]
        rows.append(_row(f"`{name}`", _fields(options), ", ".join(needs)))
    return rows


def advantage_estimators() -> list[str]:
    from divrl.algorithms import ADVANTAGE_ESTIMATORS, ADVANTAGE_OPTIONS

    header = ("name", "options (defaults)", "TRL scale_rewards", "what it is")
    rows = [_row(*header), _row(*["---"] * len(header))]
    for name, fn in sorted(ADVANTAGE_ESTIMATORS.items()):
        options = ADVANTAGE_OPTIONS[name]
        summary = (fn.__doc__ or "").strip().splitlines()[0]
        scale = f"`{options.SCALE}`" if options.SCALE else ""
        rows.append(_row(f"`{name}`", _fields(options), scale, summary))
    return rows


def engines() -> list[str]:
    from divrl.rollout import engine_names, get_engine

    header = (
        "name",
        "options (defaults)",
        "samples with",
        "`rollout_is: auto`",
        "needs",
        "what it is",
    )
    rows = [_row(*header), _row(*["---"] * len(header))]
    for name in engine_names():
        spec = get_engine(name)
        own = "its own copy of the weights" if not spec.uses_model else "the policy itself"
        needs = ", ".join(f"`{module}`" for module, _ in spec.requires)
        auto = "token" if not spec.uses_model else "off"
        rows.append(_row(f"`{name}`", _fields(spec.options), own, auto, needs, spec.summary))
    return rows


def _hook(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return f"`{value}`"
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    profile = getattr(value, "profile", None)
    return f"`{name}`" + (f" ({profile})" if isinstance(profile, str) else "")


def profiles() -> list[str]:
    from divrl.profiles import get_profile, profile_names

    header = ("data source", "aliases", "verifier", "converter", "style", "database")
    rows = [_row(*header), _row(*["---"] * len(header))]
    for name in profile_names():
        p = get_profile(name)
        rows.append(
            _row(
                f"`{p.name}`",
                ", ".join(f"`{a}`" for a in p.aliases),
                _hook(p.verifier),
                _hook(p.converter),
                _hook(p.style),
                "yes" if p.needs_database else "",
            )
        )
    return rows


def worlds() -> list[str]:
    from divrl.toy.worlds import WORLDS, world_presets, world_scaffold

    header = ("world", "what it is", "sizes", "splits", "presets")
    rows = [_row(*header), _row(*["---"] * len(header))]
    for name, kind in WORLDS.items():
        scaffold = world_scaffold(name)
        sizes = ", ".join(f"`{s}`" for s in scaffold.sizes) if scaffold else ""
        splits = ", ".join(f"`{s}`" for s in scaffold.splits) if scaffold else ""
        presets = f"`configs/{world_presets(name)}/`"
        rows.append(_row(f"`{name}`", kind.help, sizes, splits, presets))
    return rows


#: table name -> the function that writes its rows
TABLES: dict[str, Callable[[], list[str]]] = {
    "divergences": divergences,
    "policy_losses": policy_losses,
    "advantage_estimators": advantage_estimators,
    "engines": engines,
    "profiles": profiles,
    "worlds": worlds,
}


def render(text: str, where: str) -> str:
    """``text`` with every registry table in it generated again."""

    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise SystemExit(f"{where}: unknown registry table {name!r}; known: {sorted(TABLES)}")
        return match.group(1) + "\n".join(TABLES[name]()) + "\n" + match.group(4)

    return BLOCK.sub(fill, text)


def pages(docs: Path) -> list[Path]:
    return sorted(p for p in docs.glob("*.md") if "<!-- registry: " in p.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale tables, write nothing")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="the docs folder")
    args = parser.parse_args(argv)
    stale = []
    for page in pages(args.docs):
        text = page.read_text()
        new = render(text, str(page))
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(args.docs.parent)) for p in stale)
        print(f"stale registry tables in {names}: run python scripts/registry_tables.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
