# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A running v3 daemon as its lists show it: the resource's server, its namespaces with their limits, its clients.

Two UI processes (``namespace list`` and ``client list`` of the server, ``--format=csv,noheader``: the table truncates
[ref 1.2]). Parsing is tolerant where the reference says [U]/[I]: a multi-GPU cell quoted or not, a value printed
``30.00`` or ``30``, an unset limit ``-`` or empty, the client list's undocumented columns read by position (pid first,
namespace fourth [I]).
"""

from __future__ import annotations

import csv
import re
import typing as t
from dataclasses import dataclass, field

from .spec import NamespaceLimits

LIST_FORMAT = '--format=csv,noheader'
_MEM = re.compile(r'\s*(\d+)\s*([KMGT]?)i?B?\s*\Z', re.IGNORECASE)
_UNSET = ('', '-', 'none', 'n/a', 'unset')
# A priority printed as a word [U]: the CLI takes 0 (normal) and 1 (below normal) [ref 1.2]
_PRIORITY_WORDS = {'normal': 0, 'below_normal': 1, 'below normal': 1}


def namespace_list(server: str) -> t.List[str]:
    return ['namespace', 'list', '--server=%s' % server, LIST_FORMAT]


def client_list(server: str) -> t.List[str]:
    return ['client', 'list', '--server=%s' % server, LIST_FORMAT]


def rows(text: str) -> t.List[t.List[str]]:
    return [[cell.strip() for cell in row] for row in csv.reader(line for line in text.splitlines() if line.strip())]


def parse_mem(text: str) -> t.Tuple[t.Optional[int], bool]:
    """(MiB, readable) of a listed pinned-memory limit."""
    if text.strip().lower() in _UNSET:
        return None, True
    match = _MEM.match(text)
    if not match:
        return None, False
    value, unit = int(match.group(1)), match.group(2).upper()
    factor = {'': 1.0 / (1024 * 1024), 'K': 1.0 / 1024, 'M': 1, 'G': 1024, 'T': 1024 * 1024}[unit]
    return int(-(-value * factor // 1)), True


def parse_number(text: str, kind: t.Callable[[str], t.Any]) -> t.Tuple[t.Any, bool]:
    if text.strip().lower() in _UNSET:
        return None, True
    try:
        return kind(text.strip()), True
    except ValueError:
        return None, False


@dataclass(frozen=True)
class V3Readout:
    """What the daemon listed for ``server``: ``found`` False when the server is not in its lists (it exited, or was never
    made: a bad -a file, a UUID the host lacks [ref 1.3, DYN]); ``unreadable`` names the namespaces whose listed limits
    could not be read (changed as if they differed)."""

    server: str
    found: bool
    status: str = ''
    namespaces: t.Dict[str, NamespaceLimits] = field(default_factory=dict)
    unreadable: t.Tuple[str, ...] = ()
    clients: t.Tuple[t.Tuple[int, str], ...] = ()  # (pid, namespace)

    @property
    def ready(self) -> bool:
        """Listed and Ready, as the documented lists show a running server [ref 1.3] (any case): what the health check and
        its metrics ask too."""
        return self.found and self.status.strip().lower() == 'ready'

    def attached(self, namespace: str) -> t.List[int]:
        return [pid for pid, where in self.clients if where == namespace]


def parse_namespaces(server: str, text: str) -> t.Tuple[str, t.Dict[str, NamespaceLimits], t.Tuple[str, ...]]:
    """``namespace list --server=<s>`` (columns name, server, server-status, pinned-memory-limit,
    active-thread-percentage, client-priority, pipe-directory [ref 1.4]): (server status, limits by name, unreadable)."""
    status = ''
    found: t.Dict[str, NamespaceLimits] = {}
    unreadable = []
    for row in rows(text):
        if len(row) < 6 or row[1] != server:
            continue
        status = status or row[2]
        mem, ok_mem = parse_mem(row[3])
        pct, ok_pct = parse_number(row[4], float)
        word = row[5].strip().lower()
        priority, ok_priority = (_PRIORITY_WORDS[word], True) if word in _PRIORITY_WORDS else parse_number(row[5], int)
        found[row[0]] = NamespaceLimits(pct, mem, priority)
        if not (ok_mem and ok_pct and ok_priority):
            unreadable.append(row[0])
    return status, found, tuple(unreadable)


def parse_clients(server: str, text: str) -> t.Tuple[t.Tuple[int, str], ...]:
    """``client list --server=<s>``: (pid, namespace) of each client [I: pid, server, device, namespace, cmd]."""
    found = []
    for row in rows(text):
        if len(row) >= 4 and row[0].isdigit() and row[1] == server:
            found.append((int(row[0]), row[3] or 'default'))
    return tuple(found)
