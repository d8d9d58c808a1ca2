"""`colltrace report --redact`: the report with host names, user names, IP addresses and file-system paths
replaced by stable placeholders, for a ticket that leaves the building.

Stable: the same host is `host-1` everywhere in the report, the same directory `<dir-1>`. Useful: a path
keeps its file name and line (`<dir-1>/train.py:57`), and a path inside an installed package keeps the
package's own part (`<site-packages>/torch/distributed/distributed_c10d.py`), which says nothing of the
machine. Applied to the report's JSON before either format is written, so the Markdown is redacted too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from colltrace.trace.records import Run

_PATH = re.compile(r"(?<![\w.<>-])/(?:[^\s/:'\"()<>|,\[\]]+/)*[^\s/:'\"()<>|,\[\]]*")
_PACKAGES = re.compile(r"^.*?/(?:site|dist)-packages/")
_USER_DIR = re.compile(r"^/(?:home|Users|u|users)/([^/]+)/")
_WINDOWS_USER = re.compile(r"^[A-Za-z]:\\Users\\([^\\]+)\\")
_IP = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
# an IPv6 address: hex groups with a "::" in them, or all eight (a time of day, 12:30:45, is neither)
_IP6 = re.compile(
    r"(?<![\w:])(?:[0-9a-fA-F]{0,4}:){1,7}:[0-9a-fA-F:]*[0-9a-fA-F](?:%\w+)?(?![\w:])"
    r"|(?<![\w:])(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}(?![\w:])"
)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# a host name by its domain: a dotted name ending in a domain suffix (module names end in none of these)
_FQDN = re.compile(
    r"\b(?:[a-zA-Z0-9-]+\.)+(?:com|net|org|edu|gov|io|ai|internal|local|lan|corp|cluster|cloud|"
    r"intra|site|priv)\b(?![.(])"
)
_WINDOWS = re.compile(r"\b[A-Za-z]:\\(?:[^\s\\:'\"()<>|,]+\\)*[^\s\\:'\"()<>|,]*")


class Redactor:
    """Placeholders handed out in order of first appearance, one per distinct host, user, IP, directory."""

    def __init__(self, hosts: list[str]) -> None:
        self.seen: dict[str, dict[str, str]] = {"host": {}, "user": {}, "ip": {}, "email": {}, "dir": {}}
        for h in hosts:
            self._name("host", h)
        # the trace's own host names, wherever they appear (longest first); None without any
        self._hosts = (re.compile("|".join(rf"\b{re.escape(h)}\b" for h in sorted(hosts, key=len, reverse=True)))
                       if hosts else None)  # fmt: skip

    def _name(self, kind: str, value: str) -> str:
        table = self.seen[kind]
        if value not in table:
            n = len(table) + 1
            table[value] = f"<dir-{n}>" if kind == "dir" else f"{kind}-{n}"
        return table[value]

    def learn(self, s: str) -> None:
        """The user names the paths in `s` show (a home directory): to replace wherever they appear."""
        for m in [*_PATH.finditer(s), *_WINDOWS.finditer(s)]:
            user = _USER_DIR.match(m.group(0)) or _WINDOWS_USER.match(m.group(0))
            if user:
                self._name("user", user.group(1))

    def _path(self, m: re.Match[str]) -> str:
        path = m.group(0)
        if len(path) < 2:
            return path
        pkg = _PACKAGES.match(path)
        if pkg:
            return "<site-packages>/" + path[pkg.end() :]
        head, _, name = path.rpartition("/")
        return f"{self._name('dir', head or '/')}/{name}" if head else path

    def _windows(self, m: re.Match[str]) -> str:
        head, _, name = m.group(0).rpartition("\\")
        return f"{self._name('dir', head)}\\{name}"

    def text(self, s: str) -> str:
        self.learn(s)
        s = _EMAIL.sub(lambda m: self._name("email", m.group(0)), s)
        s = _WINDOWS.sub(self._windows, s)
        s = _PATH.sub(self._path, s)
        s = _IP.sub(lambda m: self._name("ip", m.group(0)), s)
        s = _IP6.sub(lambda m: self._name("ip", m.group(0)), s)
        s = _FQDN.sub(lambda m: self._name("host", m.group(0)), s)
        if self._hosts is not None:
            s = self._hosts.sub(lambda m: self.seen["host"][m.group(0)], s)
        for user, placeholder in self.seen["user"].items():
            s = re.sub(rf"\b{re.escape(user)}\b", placeholder, s)
        return s

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {self.value(k) if isinstance(k, str) else k: self.value(x) for k, x in v.items()}
        return v


def _strings(v: Any) -> Iterator[str]:
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _strings(k)
            yield from _strings(x)


def redact(report: dict[str, Any], run: Run) -> dict[str, Any]:
    """The report with every host, user, IP and path replaced; numbers, ops, groups and modules kept."""
    first: dict[str, int] = {}
    for rank, rt in sorted(run.ranks.items()):
        if len(rt.host) > 1:
            first.setdefault(rt.host, rank)
    r = Redactor(sorted(first, key=first.__getitem__))
    for s in _strings(report):  # the users first: a user name may come before the path that shows it
        r.learn(s)
    out = r.value(report)
    out["redacted"] = {kind: len(table) for kind, table in r.seen.items()}
    return out  # type: ignore[no-any-return]
