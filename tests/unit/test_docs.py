"""The docs site covers the code: every ``pt2reg`` command has a generated page listing its
options, every public API name has a mkdocstrings entry, the nav holds them, and the README
stays a short front page with the set-up commands the CI runs. ``mkdocs build --strict`` itself
runs in ``scripts/test.sh``; these checks need no build (a fraction of a second)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click
import pytest
import yaml

import registry
import registry.client
from registry.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SETUP_COMMANDS = (
    "bash scripts/quickstart.sh   # install, then export -> bundle -> push -> pull pinned -> verify -> run\n"
    "bash scripts/test.sh         # the whole suite on torch 2.13, then the torch 2.14.1 tier "
    "(starts PostgreSQL + SeaweedFS S3 itself)\n"
)


def _hook():
    spec = importlib.util.spec_from_file_location("cli_pages", DOCS / "hooks" / "cli_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(group: click.Group, ctx: click.Context, prefix: tuple[str, ...] = ()):
    """Every visible command, walked here independently of the hook."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        yield prefix + (name,), command
        if isinstance(command, click.Group):
            yield from _commands(command, click.Context(command, info_name=name, parent=ctx), prefix + (name,))


def _pages_cover(group: click.Group, pages: dict[str, str]) -> list[str]:
    missing = []
    for path, command in _commands(group, click.Context(group, info_name="pt2reg")):
        page = pages.get(f"cli/{path[0]}.md", "")
        if f"Usage: pt2reg {' '.join(path)}" not in page:
            missing.append(f"pt2reg {' '.join(path)}: no page")
            continue
        section = page.split(f"Usage: pt2reg {' '.join(path)}", 1)[1]
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and param.opts[0] not in section:
                missing.append(f"pt2reg {' '.join(path)}: {param.opts[0]} not on its page")
    return missing


def test_every_command_and_option_has_a_generated_page():
    pages = _hook().command_pages()
    assert _pages_cover(cli, pages) == []
    tops = [path[0] for path, _ in _commands(cli, click.Context(cli, info_name="pt2reg")) if len(path) == 1]
    assert len(tops) >= 25  # bundle, push, pull, ...: the group really was walked
    for top in tops:
        assert f"]({top}.md)" in pages["cli/index.md"], f"pt2reg {top} missing from the command index"


def test_each_page_is_what_help_prints():
    """The page shows exactly what ``pt2reg ... --help`` prints at the same width."""
    from click.testing import CliRunner

    pages = _hook().command_pages()
    for path, _command in _commands(cli, click.Context(cli, info_name="pt2reg")):
        result = CliRunner().invoke(cli, [*path, "--help"], prog_name="pt2reg", terminal_width=100)
        assert result.exit_code == 0, result.output
        assert f"```text\n{result.output.rstrip()}\n```" in pages[f"cli/{path[0]}.md"], " ".join(path)


def test_a_new_command_group_gets_pages_without_touching_the_docs():
    """What `pt2reg oci` (issue 43) will meet: a group added to the CLI has its pages at the next build."""
    group = click.Group("pt2reg", commands=[click.Command("push", help="Push.", params=[click.Option(["--json"])])])
    oci = click.Group("oci", help="OCI delivery.")
    oci.add_command(click.Command("push", help="Push a version to an OCI registry.",
                                  params=[click.Argument(["ref"]), click.Option(["--tag"], help="The tag.")]))
    group.add_command(oci)
    pages = _hook().command_pages(group)
    assert set(pages) == {"cli/index.md", "cli/push.md", "cli/oci.md"}
    assert "Usage: pt2reg oci push [OPTIONS] REF" in pages["cli/oci.md"] and "--tag" in pages["cli/oci.md"]
    assert _pages_cover(group, pages) == []
    pages["cli/oci.md"] = pages["cli/oci.md"].replace("--tag", "--tga")  # a page that drifted is caught
    assert _pages_cover(group, pages) == ["pt2reg oci push: --tag not on its page"]


def test_the_nav_lists_every_generated_page():
    hook = _hook()
    config = {"nav": yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]}
    hook.on_config(config)
    listed = set(re.findall(r"'(cli/[\w-]+\.md)'", repr(config["nav"])))
    assert listed == set(hook.command_pages()), "the nav's 'CLI reference' section is not the generated pages"
    with pytest.raises(ValueError, match="no 'CLI reference' section"):
        hook.on_config({"nav": [{"Home": "index.md"}]})


def _documented() -> set[str]:
    found = set()
    for page in (DOCS / "api").glob("*.md"):
        found.update(re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), re.M))
    return found


@pytest.mark.parametrize("module", [registry, registry.client], ids=lambda m: m.__name__)
def test_every_public_api_name_has_a_reference_entry(module):
    documented = _documented()
    missing = []
    for name in module.__all__:
        ours = f"{module.__name__}.{name}"
        face = f"registry.{name}"  # a client name may be documented through the package face
        if ours in documented or (face in documented and getattr(registry, name, None) is getattr(module, name)):
            continue
        missing.append(ours)
    assert missing == [], f"no '::: NAME' entry in docs/api/*.md for {missing}"


def test_every_api_entry_names_something_public():
    """A stale entry (a name renamed or dropped) is a page about nothing: the strict build
    catches what griffe cannot resolve, this catches what the package no longer exports."""
    public = {f"registry.{n}" for n in registry.__all__} | {f"registry.client.{n}" for n in registry.client.__all__}
    assert _documented() - public == set()


def test_readme_is_a_short_front_page_with_the_setup_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 10 * 1024, "README.md is over 10 KB: move the detail into docs/"
    assert len((ROOT / "benchmarks" / "README.md").read_bytes()) <= 15 * 1024, (
        "benchmarks/README.md is over 15 KB: runs go to docs/performance-log.md")
    for text in (readme, (DOCS / "getting-started.md").read_text()):
        assert SETUP_COMMANDS in text
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"
    assert "mkdocs serve" in readme
