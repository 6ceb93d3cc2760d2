"""Shared CLI plumbing: the app context, error translation, JSON output, progress bars."""
from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

import click

from ..errors import RegistryError, UsageError, brief
from .render import clean  # control characters in an error never reach the terminal raw

if TYPE_CHECKING:
    from ..client import Registry
    from ..config import Settings

__all__ = ["App", "RegistryGroup", "pass_app", "emit_json", "warn", "info", "transfer_progress",
           "parse_key_values", "DEVICE", "status"]


class App:
    """Lazily built API objects for one CLI invocation; ``close()`` (registered with the click
    context) releases the registry's database connections when the command ends."""

    def __init__(self, home: str | None, db: str | None, store: str | None, *, registry: str | None = None,
                 token_file: str | None = None) -> None:
        self._args = (home, db, store)
        self._remote = {"registry": registry, "token_file": token_file}

    @cached_property
    def settings(self) -> Settings:
        from ..config import Settings

        return Settings.resolve(*self._args, **self._remote)

    def require_direct(self, command: str) -> None:
        """``UsageError`` (exit 2) when a registry server is selected: ``command`` works on the
        database itself, which only the server's operator reaches."""
        if self.settings.remote:
            raise UsageError(f"`pt2reg {command}` works on the database directly, not through the registry "
                             f"server at {self.settings.url}",
                             hint="run it where the server's database is reachable, with --db (and no "
                                  "--registry / PT2REG_URL)")

    @cached_property
    def registry(self) -> Registry:
        from ..client import Registry

        url = self.settings.url
        if url is not None and url.startswith("http://") and not _loopback(url):
            warn(f"{url} is plain HTTP: the token and the models cross the network unencrypted; "
                 f"serve the registry behind TLS and use https://")
        return Registry(self.settings)

    def close(self) -> None:
        if "registry" in self.__dict__:
            self.registry.close()


pass_app = click.make_pass_decorator(App)


def _loopback(url: str) -> bool:
    """True for a URL on this machine (localhost, 127.0.0.0/8, ::1)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RegistryGroup(click.Group):
    """Turns RegistryError into one stderr line and the contract's exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RegistryError as exc:
            click.echo(f"error: {clean(exc.one_line())}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            ctx.exit(130)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:
            ctx.exit(1)
        except OSError as exc:
            click.echo(f"error: {os_error_line(exc)}", err=True)
            ctx.exit(1)
        except Exception as exc:  # a bug of ours: still one line, the traceback on request
            if os.environ.get("PT2REG_DEBUG"):
                raise
            click.echo(f"error: unexpected {type(exc).__name__}: {clean(brief(exc))} (set PT2REG_DEBUG=1 for a "
                       f"traceback, and please report it)", err=True)
            ctx.exit(1)


_OS_HINTS = {
    errno.ENOSPC: "free some space there, or write elsewhere (-o, --home / PT2REG_HOME)",
    errno.EDQUOT: "free some space there, or write elsewhere (-o, --home / PT2REG_HOME)",
    errno.EFBIG: "a file size limit (ulimit -f) stopped the write",
    errno.EACCES: "check the permissions of that path",
    errno.EROFS: "that file system is read-only; write elsewhere",
}


def os_error_line(exc: OSError) -> str:
    """One line for an operating-system error: what failed, on which path, and what to do."""
    text = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    hint = _OS_HINTS.get(exc.errno or 0)
    return " ".join((f"{text}; {hint}" if hint else text).split())


def emit_json(value: Any) -> None:
    """The one JSON document a ``--json`` command prints on stdout (``format.jsondoc``: the
    encoder the server's answers use too)."""
    from ..format.jsondoc import dumps

    click.echo(dumps(value, indent=2))


def warn(message: str) -> None:
    click.echo(f"warning: {clean(message)}", err=True)


def info(message: str) -> None:
    click.echo(message, err=True)


def status(message: str) -> None:
    """One line on a terminal's stderr saying what a long step is doing (the first-load
    sandbox); nothing when stderr is not a terminal, where scripts read errors as one line."""
    if sys.stderr.isatty():
        click.echo(f"{clean(message)} ...", err=True)


@contextmanager
def transfer_progress(total: int, label: str, *, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on a terminal for large transfers; nothing otherwise."""
    if not enabled or total < 8 * 1024 * 1024 or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def parse_key_values(values: tuple[str, ...], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=what)
        out[key] = val
    return out


class _DeviceParam(click.ParamType):
    """``--device``: read by the one device parser (``registry.runtime.device.Device.parse``);
    a bad value is its ``UsageError``: one line, exit 2, like every other bad value."""

    name = "device"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ..runtime.device import Device

        return Device.parse(value)


DEVICE = _DeviceParam()
