"""MkDocs hook: one page per ``pt2reg`` command, generated from the click group at build time.

The pages are click's own ``--help`` text for each command (and each subcommand of a group),
so they cannot drift from the code: a new command, option or help line appears in the next
build, and a removed one disappears. Nothing is written to ``docs/``; the pages are generated
files (``cli/<command>.md``) and the nav's "CLI reference" section is filled with them.

Why a hook and not ``mkdocs-click``: ``mkdocs-click`` renders a command where a hand-written
page holds a ``::: mkdocs-click`` directive, so a new command (``pt2reg oci``, say) has no page
until someone writes one, which is the drift this is meant to prevent. Here the group is walked,
and the same walk (``command_pages``) is what ``tests/unit/test_docs.py`` checks.
"""
from __future__ import annotations

from typing import Any

import click

#: The nav section the generated pages fill (``mkdocs.yml`` lists it with the overview only).
NAV_SECTION = "CLI reference"
#: Wide enough that click does not re-wrap help text written for 100 columns (``max_content_width``).
WIDTH = 100
PROG = "pt2reg"


def _root() -> click.Group:
    from registry.cli import cli  # the real group, with every command module's COMMANDS added

    return cli


def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    return click.Context(command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)


def walk(group: click.Group, ctx: click.Context) -> list[tuple[tuple[str, ...], click.Command, click.Context]]:
    """Every visible command under ``group``, depth first, as (path, command, its context)."""
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = _context(command, name, ctx)
        path = tuple(sub.command_path.split()[1:])
        found.append((path, command, sub))
        if isinstance(command, click.Group):
            found.extend(walk(command, sub))
    return found


def _section(level: int, path: tuple[str, ...], command: click.Command, ctx: click.Context) -> list[str]:
    lines = [f"{'#' * level} `{PROG} {' '.join(path)}`", ""]
    short = command.get_short_help_str(limit=WIDTH)
    if short:
        lines += [short, ""]
    lines += ["```text", command.get_help(ctx).rstrip(), "```", ""]
    return lines


def command_pages(group: click.Group | None = None) -> dict[str, str]:
    """``{"cli/<command>.md": markdown}``: one page per top-level command, its subcommands within."""
    group = group or _root()
    # the group's own settings (-h as well as --help), inherited by every command's context
    root = click.Context(group, info_name=PROG, **{"max_content_width": WIDTH, **group.context_settings,
                                                   "terminal_width": WIDTH})
    pages: dict[str, list[str]] = {}
    for path, command, ctx in walk(group, root):
        top = path[0]
        page = pages.setdefault(f"cli/{top}.md", [])
        page += _section(1 if len(path) == 1 else 2, path, command, ctx)
    index = ["# Command line reference", "",
             f"Generated at build time from `{PROG} --help` and each command's `--help` "
             "(`docs/hooks/cli_pages.py`), so it matches the installed code.", "",
             "```text", group.get_help(root).rstrip(), "```", "",
             "| command | what it does |", "|---|---|"]
    for path, command, _ctx in walk(group, root):
        if len(path) == 1:
            help_ = command.get_short_help_str(limit=WIDTH).replace("|", "\\|")
            index.append(f"| [`{PROG} {path[0]}`]({path[0]}.md) | {help_} |")
    out = {"cli/index.md": "\n".join(index) + "\n"}
    out.update({path: "\n".join(lines) for path, lines in sorted(pages.items())})
    return out


# ---- the MkDocs events ----------------------------------------------------------------------

_PAGES: dict[str, str] = {}


def on_config(config: Any) -> Any:
    """Fill the nav's "CLI reference" section with the generated pages."""
    _PAGES.clear()
    _PAGES.update(command_pages())
    entries: list[Any] = [{"Overview": "cli/index.md"}]
    entries += [{f"{PROG} {path[4:-3]}": path} for path in _PAGES if path != "cli/index.md"]
    if not _fill(config["nav"] or [], entries):
        raise ValueError(f"mkdocs.yml: the nav has no {NAV_SECTION!r} section for the generated command pages")
    return config


def _fill(nav: list[Any], entries: list[Any]) -> bool:
    for item in nav:
        if not isinstance(item, dict):
            continue
        if NAV_SECTION in item:
            item[NAV_SECTION] = entries
            return True
        if any(isinstance(v, list) and _fill(v, entries) for v in item.values()):
            return True
    return False


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in _PAGES.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            raise ValueError(f"docs/{path} exists; command pages are generated, remove it")
        files.append(File.generated(config, path, content=content))
    return files
