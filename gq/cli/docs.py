"""The command reference, written from the typer app itself: docs/commands.md and docs/gq.1.

``python -m gq.cli.docs`` (from the repository root) rewrites both; ``--check`` only says
whether they are stale. Both are rendered from the click command tree that ``gq`` runs, so
a command's options, help and defaults cannot drift from the pages. Nothing here reads the
terminal or the environment: the help records are not wrapped to a width, no colours
are asked for, and the commands come in the order the app lists them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import typer
import typer.core

from gq import __version__
from gq.cli.app import make_app

TYPE_CHECKING = False
if TYPE_CHECKING:
    # typer 0.28 carries its own copy of click (pyproject pins it below 0.29): its commands
    # are that copy's, not the click package's.
    from typer._click import Command

MARKDOWN = Path("docs/commands.md")
MAN = Path("docs/gq.1")
REGENERATE = "python -m gq.cli.docs"


@dataclass
class Page:
    """One command as its help shows it: what both renderings are made from."""

    path: str  # "gq daemon start"
    depth: int  # 0 for gq itself, 1 for gq submit, 2 for gq daemon start
    summary: str
    help: str
    usage: str
    arguments: list[tuple[str, str]]
    options: list[tuple[str, str]]
    epilog: str
    children: list[Page] = field(default_factory=list)


def _page(command: Command, ctx: typer.Context, depth: int) -> Page:
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            (arguments if param.param_type_name == "argument" else options).append(record)
    page = Page(
        path=ctx.command_path,
        depth=depth,
        # The help's first sentence however long: click's default cuts it at 45 characters.
        summary=command.get_short_help_str(limit=1000),
        help=(command.help or "").strip(),
        usage=" ".join([ctx.command_path, *command.collect_usage_pieces(ctx)]),
        arguments=arguments,
        options=options,
        epilog=(command.epilog or "").strip(),
    )
    if isinstance(command, typer.core.TyperGroup):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            child = typer.Context(sub, info_name=name, parent=ctx, **sub.context_settings)
            page.children.append(_page(sub, child, depth + 1))
    return page


def pages() -> Page:
    """Every command of ``gq``, as a tree of pages rooted at ``gq`` itself."""
    root = typer.main.get_command(make_app())
    ctx = typer.Context(root, info_name="gq", color=False, **root.context_settings)
    return _page(root, ctx, 0)


def _walk(page: Page) -> list[Page]:
    return [page, *(p for child in page.children for p in _walk(child))]


def _anchor(path: str) -> str:
    """The anchor GitHub gives the heading `` `gq daemon start` ``."""
    return path.replace(" ", "-")


def _markdown_text(text: str) -> str:
    """Help text as Markdown shows it: as written, except that a ``*`` could start
    emphasis and a line starting with ``#`` or ``<`` would become a heading or a tag."""
    text = text.replace("*", "\\*")
    return "\n".join(
        "\\" + line if line.lstrip().startswith(("#", "<")) else line for line in text.split("\n")
    )


def markdown() -> str:
    """docs/commands.md."""
    root = pages()
    out = [
        "# Command reference",
        "",
        f"<!-- Written by `{REGENERATE}` from gq's typer app: edit the commands' help, "
        "not this page. -->",
        "",
        "Every `gq` command with its options, as `gq COMMAND --help` prints them. "
        "The same page as a manual: `man docs/gq.1`.",
        "",
    ]
    out += [
        f"{'  ' * (p.depth - 1)}- [`{p.path}`](#{_anchor(p.path)}): {p.summary}"
        for p in _walk(root)[1:]
    ]
    for page in _walk(root):
        out += ["", f"{'#' * (max(page.depth, 1) + 1)} `{page.path}`", ""]
        if page.help:
            out += [_markdown_text(page.help), ""]
        out += ["```", page.usage, "```"]
        for title, records in (("Arguments", page.arguments), ("Options", page.options)):
            if records:
                out += ["", f"**{title}**:", ""]
                out += [f"- `{name}`: {_markdown_text(text)}" for name, text in records]
        if page.epilog:
            out += ["", _markdown_text(page.epilog)]
    return "\n".join(out) + "\n"


def _roff(text: str) -> str:
    """Text as troff sets it: backslashes escaped, no line read as a request."""
    lines = []
    for line in text.replace("\\", "\\e").split("\n"):
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _roff_name(text: str) -> str:
    """An option's or a command's spelling: its hyphens are minus signs, so that a reader
    can search for and copy them."""
    return _roff(text).replace("-", "\\-")


def _roff_paragraphs(text: str) -> list[str]:
    return [
        line
        for paragraph in text.split("\n\n")
        if paragraph.strip()
        for line in (".PP", _roff(paragraph.strip()))
    ]


def man() -> str:
    """docs/gq.1: every command on one manual page, the subcommands as its sections."""
    root = pages()
    out = [
        f".\\\" Written by {REGENERATE} from gq's typer app: edit the commands' help.",
        f'.TH GQ 1 "" "gq {__version__}" "User Commands"',
        ".SH NAME",
        "gq \\- a Slurm\\-like job queue for one GPU node",
        ".SH SYNOPSIS",
        f".B {_roff_name(root.usage)}",
        ".SH DESCRIPTION",
        *_roff_paragraphs(root.help),
    ]

    def section(page: Page) -> list[str]:
        lines = []
        for title, records in (("Arguments", page.arguments), ("Options", page.options)):
            if records:
                lines += [".PP", f"{title}:"]
                for name, text in records:
                    lines += [".TP", f".B {_roff_name(name)}", _roff(text)]
        if page.epilog:
            lines += _roff_paragraphs(page.epilog)
        return lines

    out += [".SH OPTIONS", *section(root)[2:], ".SH COMMANDS"]
    for page in _walk(root)[1:]:
        out += [f'.SS "{_roff_name(page.path)}"', ".PP", f".B {_roff_name(page.usage)}"]
        out += _roff_paragraphs(page.help) + section(page)
    out += [".SH SEE ALSO", "docs/commands.md, the same reference in Markdown"]
    return "\n".join(out) + "\n"


def rendered() -> dict[Path, str]:
    """Each generated file (relative to the repository root) and what it should hold."""
    return {MARKDOWN: markdown(), MAN: man()}


def main(argv: list[str] | None = None) -> int:
    """Write the pages under the current directory, or with --check say which are stale."""
    args = sys.argv[1:] if argv is None else argv
    check = args == ["--check"]
    if args and not check:
        print(f"usage: {REGENERATE} [--check]", file=sys.stderr)
        return 2
    stale = []
    for path, text in rendered().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if check and stale:
        print(f"stale: {', '.join(map(str, stale))}; run {REGENERATE}", file=sys.stderr)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
