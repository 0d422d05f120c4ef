# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One control batch: a daemon's health and default limits, its servers and their limits, read in one UI process.

mps_limits, mps_info (and so the role) ask the same batch and parse it the same way. Which of the
daemon's children are servers is only known from ``get_server_list`` in the same batch, so each child
is asked about as if it were one; the framing (``framing.py``) keeps the error texts a non-server gets
(undocumented, possibly empty) from shifting the replies.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from .._errors import MpsError
from .commands import GET_DEFAULT_PRIORITY, LSPART, command, parse_percentage, parse_pids, parse_priority
from .framing import SENTINEL, Reply
from .readback import parse_readback, readback_readable

SERVER_STATES = ('INITIALIZING', 'ACTIVE', 'FAULT')


@dataclass
class ServerReadout:
    """One server as the daemon reported it; limits by device ordinal."""

    pid: int
    status: t.Optional[str] = None
    clients: t.List[int] = field(default_factory=list)
    active_thread_percentage: t.Optional[float] = None
    pinned_device_mem_limit: t.List[t.Optional[str]] = field(default_factory=list)


@dataclass
class DaemonReadout:
    """What one daemon reported: its default limits (memory by ordinal) and its listed servers."""

    default_percentage: float
    default_mem: t.List[t.Optional[str]]
    servers: t.List[ServerReadout] = field(default_factory=list)
    # get_default_client_priority: 0 normal, 1 below normal; None when the daemon did not answer a priority (a binary
    # without client priority answers an error text, kept in priority_text)
    default_priority: t.Optional[int] = None
    priority_text: str = ''
    # lspart's answer, asked only of a daemon started with -S (None: not asked)
    lspart_text: t.Optional[str] = None


def batch_commands(ordinals: int, candidates: t.Sequence[int], *, partitions: bool = False) -> t.List[str]:
    """Every read for one daemon: health and defaults, its server list, and each candidate server.

    Each candidate's percentage query comes last in its block, and the last block's is the last
    command of the batch, which needs no fence: with one server (the usual case) nothing is fenced.
    """
    cmds = [SENTINEL, command('get_server_list')]
    cmds.extend(command('get_default_device_pinned_mem_limit', ordinal) for ordinal in range(ordinals))
    cmds.append(command(GET_DEFAULT_PRIORITY))
    if partitions:
        cmds.append(command(LSPART))
    for pid in candidates:
        cmds.append(command('get_server_status', pid))
        cmds.append(command('get_client_list', pid))
        cmds.extend(command('get_device_pinned_mem_limit', pid, ordinal) for ordinal in range(ordinals))
        cmds.append(command('get_active_thread_percentage', pid))
    return cmds


def mem_text(reply: Reply) -> t.Optional[str]:
    """A memory limit as the daemon printed it, an unknown reply (``N/A``...) included; None when plainly unset."""
    text = reply.text.strip()
    return text if parse_readback(text) is not None or not readback_readable(text) else None


def optional_percentage(reply: Reply) -> t.Optional[float]:
    """A percentage, or None for a pid that is not (or no longer) a server."""
    try:
        return parse_percentage(reply)
    except MpsError:
        return None


def parse_batch(replies: t.Sequence[Reply], ordinals: int, candidates: t.Sequence[int], *, partitions: bool = False) -> DaemonReadout:
    """Turn the replies to :func:`batch_commands` into a readout; only listed servers are reported.

    The health answer and the server list must parse (else the binary or the daemon is broken: that
    raises); what a candidate that is no server answers is simply not reported.
    """
    it = iter(replies)
    default_percentage = parse_percentage(next(it))
    listed = parse_pids(next(it))
    default_mem = [mem_text(next(it)) for _ordinal in range(ordinals)]
    priority = next(it)
    lspart = next(it).text if partitions else None
    asked: t.Dict[int, ServerReadout] = {}
    for pid in candidates:
        status = next(it)
        clients = next(it)
        mem = [mem_text(next(it)) for _ordinal in range(ordinals)]
        percentage = optional_percentage(next(it))
        try:
            client_pids = parse_pids(clients)
        except MpsError:
            client_pids = []
        asked[pid] = ServerReadout(pid, status.text if status.text in SERVER_STATES else None, client_pids, percentage, mem)
    # A server that is not a child of the daemon (another pid namespace) is listed, not detailed.
    return DaemonReadout(default_percentage, default_mem, [asked.get(pid) or ServerReadout(pid) for pid in listed],
                         parse_priority(priority), priority.text.strip(), lspart)


def read_batch(query: t.Callable[[t.List[str]], t.List[Reply]], ordinals: int, candidates: t.Sequence[int],
               *, partitions: bool = False) -> DaemonReadout:
    """Ask a daemon with ``ordinals`` devices everything at once (``query`` runs one UI process); ``partitions``: and
    its SM partitions (``lspart``), for a daemon started with -S."""
    return parse_batch(query(batch_commands(ordinals, candidates, partitions=partitions)), ordinals, candidates, partitions=partitions)
