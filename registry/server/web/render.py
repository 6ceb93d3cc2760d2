"""The Jinja2 environment of the web pages: templates and the stylesheet ship inside the package
(no CDN: the machines that run the server may have no internet), autoescaped, compiled once."""
from __future__ import annotations

import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from markupsafe import Markup

from ...format.times import iso_utc
from .compare import dim_text, shape_text

__all__ = ["render", "human_size"]

_HERE = Path(__file__).resolve().parent


def human_size(n: int | None) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units; bytes as a whole number)."""
    if n is None:
        return "-"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, unit = float(n), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def _when(t: datetime | None) -> Markup | str:
    """A time as every page (and the CLI, and ``--json``) writes it: ISO 8601 UTC to the second,
    in a ``<time>`` element that carries the exact value (hover shows it) and never wraps."""
    if t is None:
        return "-"
    exact = iso_utc(t)
    return Markup(f'<time datetime="{exact}" title="{exact}">{iso_utc(t, seconds=True)}</time>')


def _short(digest: str | None, n: int = 12) -> str:
    if not digest:
        return "-"
    algo, _, hexpart = digest.partition(":")
    return f"{algo}:{hexpart[:n]}" if hexpart else digest[:n]


_HASH = re.compile(r"(?:sha256:)?[0-9a-f]{40,}\Z")


def _fold(value: Any, n: int = 12) -> Markup | str:
    """A hash or digest folded to its first ``n`` hex digits, the whole value in the title
    (hover to read it, select to copy it); any other value as its text."""
    text = str(value)
    if not _HASH.match(text):
        return text
    return Markup('<span class="hash" title="{0}">{1}…</span>').format(text, _short(text, n))


@lru_cache(maxsize=1)
def _env() -> Any:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(str(_HERE / "templates")),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True, auto_reload=False)
    env.filters.update(size=human_size, when=_when, short=_short, fold=_fold, dim=dim_text, shape=shape_text)
    env.globals["stylesheet"] = (_HERE / "static" / "style.css").read_text("utf-8")
    return env


def render(template: str, **values: Any) -> str:
    return _env().get_template(template).render(**values)
