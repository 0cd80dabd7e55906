"""Every flag and argument of every `loom` command says what it is for (`--help`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from loom.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "loom"
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


PARSERS = dict(_parsers(build_parser()))


def _undocumented(parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if not (action.help or "").strip():
            missing.append("/".join(action.option_strings) or action.dest)
    return missing


def test_the_walk_finds_every_command() -> None:
    for command in ("loom sim", "loom compare", "loom up", "loom submit", "loom status",
                    "loom demo", "loom serve", "loom replay", "loom log export", "loom models"):
        assert command in PARSERS, command


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_every_flag_has_help(path: str) -> None:
    assert _undocumented(PARSERS[path]) == [], f"{path}: flags without help"


def test_every_subcommand_has_help() -> None:
    for path, parser in PARSERS.items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                listed = {a.dest for a in action._choices_actions}
                assert listed == set(action.choices), f"{path}: subcommands without help"
