"""Every command line the documentation shows is accepted by the real command-line parser, in
its documented spelling (hidden former names too), and every flag its prose names in a code
span belongs to some command: a renamed or misspelled option fails here, not in a user's shell.

Parsing only (click's own parser, the commands' real options): nothing runs. Where a line
shows no placeholder, its values are converted too (bounds, choices, units).
"""

from __future__ import annotations

import pytest
import typer
from typer._click import ClickException, Command, Context  # typer vendors click

from kvcr_policy.cli import app
from tests.docs.commands import Documented, documented_commands, prose_flags

GROUP = typer.main.get_command(app)
COMMANDS: dict[str, Command] = {name: GROUP.get_command(Context(GROUP), name) for name in  # type: ignore[attr-defined]
            GROUP.list_commands(Context(GROUP))}  # type: ignore[attr-defined]  # fmt: skip
DOCUMENTED = documented_commands()
#: Flags of other programs that the prose names (SGLang's, pip's, pytest's, mkdocs').
OTHERS = {"--enable-metrics", "--hicache-storage-backend-extra-config"}


def _options(command: Command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)
            if name.startswith("-")}  # fmt: skip


def _parse(documented: Documented, strict: bool) -> None:
    args = list(documented.args)
    if args[0].startswith("-"):  # kvcr-policy --version
        GROUP.make_context("kvcr-policy", args, resilient_parsing=True)
        return
    command = COMMANDS.get(args[0])
    assert command is not None, f"{documented.where}: no command {args[0]!r}: {documented.text}"
    known = _options(command) | {"--help"}
    for word in args[1:]:
        if word == "--":
            break
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            assert name in known, (
                f"{documented.where}: kvcr-policy {args[0]} has no option {name}: {documented.text}"
            )
    if documented.partial:
        return
    if strict and "--help" not in args:
        command.make_context(f"kvcr-policy {args[0]}", args[1:], resilient_parsing=False)
    else:
        command.make_context(f"kvcr-policy {args[0]}", args[1:], resilient_parsing=True)


def test_the_docs_show_the_commands() -> None:
    shown = {d.args[0] for d in DOCUMENTED}
    assert len(DOCUMENTED) > 100 and {"bench", "tune", "plan", "serve", "show"} <= shown


@pytest.mark.parametrize("documented", DOCUMENTED, ids=lambda d: f"{d.where} {d.text[:60]}")
def test_every_documented_command_line_parses(documented: Documented) -> None:
    try:
        _parse(documented, strict=not documented.placeholders)
    except ClickException as error:
        pytest.fail(f"{documented.where}: {documented.text}\n  {error.format_message()}")


def test_every_flag_the_prose_names_is_an_option_of_a_command() -> None:
    every = set().union(*(_options(c) for c in COMMANDS.values())) | _options(GROUP)
    unknown = [f"{where}: {flag}" for where, flag in prose_flags()
               if flag not in every and flag not in OTHERS]  # fmt: skip
    assert not unknown, "\n".join(unknown)


def test_every_hidden_former_name_is_refused_beside_its_new_name() -> None:
    """A hidden option is a former spelling: documented nowhere new, accepted, and refused
    together with its new name (tests/tune and tests/plan drive each one's effect)."""
    hidden = {(name, opt) for name, c in COMMANDS.items() for p in c.params
              if getattr(p, "hidden", False) for opt in p.opts}  # fmt: skip
    assert hidden, "the former names live on as hidden options"


@pytest.mark.parametrize(
    "text", ["kvcr-policy tune --output site.toml --output-alwayz", "kvcr-policy plan --tp x"]
)
def test_the_walk_refuses_a_flag_or_value_the_parser_refuses(text: str) -> None:
    with pytest.raises((AssertionError, ClickException)):  # type: ignore[arg-type]
        _parse(Documented("here", text, tuple(text.split()[1:])), strict=True)
