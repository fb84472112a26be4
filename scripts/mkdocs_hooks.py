"""MkDocs hooks (mkdocs.yml `hooks:`).

- The CLI reference page is generated from the click commands of `orchestrator.cli.orchestrate:main` at build
  time, so it is never out of date: on the page that holds the marker line, the marker becomes one
  section per command (and subcommand), each with the command's own `--help` text.
- The home page is README.md (docs/index.md links to it), whose links point into docs/ from the
  repository's root: on the site they point at the pages beside it.
- The benchmarks page is benchmarks/README.md (docs/benchmarks.md links to it), whose links point
  into docs/ from benchmarks/ (`../docs/PAGE`): on the site they too point at the pages beside it."""

from __future__ import annotations

import click

MARKER = "<!-- cli-reference -->"


def _commands(command: click.Command, ctx: click.Context):
    """Yield (context, command) for `command` and, for a group, every subcommand, depth first."""
    yield ctx, command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx))


def cli_reference() -> str:
    from orchestrator.cli.orchestrate import main

    root = click.Context(main, info_name="orchestrate", terminal_width=100, max_content_width=100)
    sections = []
    for ctx, command in _commands(main, root):
        path = ctx.command_path
        summary = command.get_short_help_str(limit=200)
        sections.append(f"## `{path}`\n\n{summary}\n\n```text\n{command.get_help(ctx)}\n```\n")
    return "\n".join(sections)


def readme_links_from_docs(markdown: str) -> str:
    """README.md's `](docs/PAGE)` and `](CHANGELOG.md)` links as links from docs/index.md."""
    return markdown.replace("](docs/", "](").replace("](CHANGELOG.md)", "](changelog.md)")


def benchmarks_links_from_docs(markdown: str) -> str:
    """benchmarks/README.md's `](../docs/PAGE)` links as links from docs/benchmarks.md."""
    return markdown.replace("](../docs/", "](")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == "index.md":
        markdown = readme_links_from_docs(markdown)
    if page.file.src_uri == "benchmarks.md":
        markdown = benchmarks_links_from_docs(markdown)
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return markdown
