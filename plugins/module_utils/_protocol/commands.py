# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The control commands this collection sends, built from plain tokens, and the parsers of their replies.

The UI exits 0 even when the daemon rejects a command, printing the error text as the reply; so every
reply is parsed for the positive answer, never matched against error texts (which are undocumented).
"""

from __future__ import annotations

import re
import typing as t

from .._errors import ControlCommandError, InvalidParameterError
from .framing import PERCENT_COMMANDS, PERCENT_LINE, Reply


_TOKEN = re.compile(r'[A-Za-z0-9][A-Za-z0-9._:=-]*')


def command(name: str, *args: t.Union[str, int, float]) -> str:
    """Build one control command from plain tokens.

    Every token must be a single word of letters, digits and ``._:=-``: no whitespace, newline or
    other character can reach the control pipe, so no value can smuggle in a second command.
    """
    tokens = [name] + [str(arg) for arg in args]
    for token in tokens:
        if not _TOKEN.fullmatch(token):
            raise InvalidParameterError('command', 'refusing to send %r to the control daemon: not a plain token' % token)
    return ' '.join(tokens)


# The commands that set a daemon's defaults: what a start replays (the unit's ExecStartPost=, mps_daemon's first session).
SET_DEFAULT_PERCENTAGE = 'set_default_active_thread_percentage'
SET_DEFAULT_MEM = 'set_default_device_pinned_mem_limit'
SET_DEFAULT_PRIORITY = 'set_default_client_priority'
GET_DEFAULT_PRIORITY = 'get_default_client_priority'
# Static SM partitions (binary 13010, CUDA 13.1, and later; a daemon started with -S): created after every start.
SM_PARTITION = 'sm_partition'
LSPART = 'lspart'
REPLAYABLE = (SET_DEFAULT_PERCENTAGE, SET_DEFAULT_MEM, SET_DEFAULT_PRIORITY, SM_PARTITION)
# What ``sm_partition add`` prints on success: ``Partition <uuid>/<id> created`` (what client code written against real
# binaries parses); NVIDIA's example shows the bare ``<uuid>/<id>``. The id is base64 and may hold slashes.
_PARTITION_CREATED = re.compile(r'(?:Partition\s+)?(?P<value>(?:GPU|MIG)-[0-9A-Za-z-]+/[A-Za-z0-9+/=]+)(?:\s+created)?')
_PARTITION_ID = re.compile(r'[A-Za-z0-9+/=]+')
# The default client priority as the daemon takes it (r580 help: "Sets default client priority for incoming clients";
# CUDA_MPS_CLIENT_PRIORITY: 0 normal, 1 below normal) and as users name it.
PRIORITIES = {'normal': 0, 'below_normal': 1}
PRIORITY_NAMES = {value: name for name, value in PRIORITIES.items()}


def set_default_percentage(percentage: str) -> str:
    return command(SET_DEFAULT_PERCENTAGE, percentage)


def set_default_mem(ordinal: int, mib: int) -> str:
    return command(SET_DEFAULT_MEM, ordinal, '%dM' % mib)


def set_default_priority(priority: int) -> str:
    return command(SET_DEFAULT_PRIORITY, int(priority))


def sm_partition_add(uuid: str, chunks: int) -> str:
    """Create a partition of ``chunks`` chunks on the GPU ``uuid`` (a daemon started with -S)."""
    return command(SM_PARTITION, 'add', uuid, int(chunks))


def sm_partition_rm(uuid: str, ident: str) -> str:
    """Remove partition ``ident`` (the part after the UUID's slash) of ``uuid``: the documented two-word form."""
    if not _PARTITION_ID.fullmatch(ident):
        raise InvalidParameterError('command', 'refusing to send the partition id %r to the control daemon: not base64' % ident)
    return '%s %s' % (command(SM_PARTITION, 'rm', uuid), ident)


def partition_created(reply: Reply) -> t.Optional[str]:
    """The partition (``<uuid>/<id>``, what clients set as CUDA_MPS_SM_PARTITION) an ``sm_partition add`` created; None:
    it failed, and its text (``Failed to fulfill the requested SM partition of ...``) is the reason."""
    match = _PARTITION_CREATED.fullmatch(reply.text.strip()) if len(reply.lines) == 1 else None
    return match.group('value') if match else None


def parse_priority(reply: Reply) -> t.Optional[int]:
    """``get_default_client_priority``'s answer: 0 or 1 (r580 prints the number; ``NORMAL``/``BELOW_NORMAL`` read too),
    None for anything else - the error text of a binary without client priority, or no answer."""
    text = reply.text.strip()
    if text in ('0', '1'):
        return int(text)
    return PRIORITIES.get(text.lower())


def set_server_percentage(pid: int, percentage: str) -> str:
    """A running server's own thread percentage (its later clients get it)."""
    return command('set_active_thread_percentage', pid, percentage)


def set_server_mem(pid: int, ordinal: int, mib: int) -> str:
    return command('set_device_pinned_mem_limit', pid, ordinal, '%dM' % mib)


QUIT = 'quit'


def quit_command(timeout: int) -> str:
    """``quit -t``: servers get ``timeout`` seconds to exit, then are forced."""
    return '%s -t %d' % (QUIT, int(timeout))  # an option, not a plain token: built from an int only


def default_percentage_of(cmd: str) -> t.Optional[str]:
    """The value a replayed ``set_default_active_thread_percentage`` sets, None for another command."""
    words = cmd.split()
    return words[1] if len(words) == 2 and words[0] == SET_DEFAULT_PERCENTAGE else None


def parse_percentage(reply: Reply) -> float:
    """Parse a one-line ``%.1f`` reply, or raise with the daemon's text."""
    if len(reply.lines) == 1 and PERCENT_LINE.fullmatch(reply.lines[0]):
        return float(reply.lines[0])
    raise ControlCommandError('the MPS control daemon rejected %r: %s' % (reply.command, reply.text or '(no output)'))


def expect_silent(reply: Reply) -> None:
    """A command that prints nothing on success printed something: that is its error text."""
    if reply.lines:
        raise ControlCommandError('the MPS control daemon rejected %r: %s' % (reply.command, reply.text))


def check_applied(replies: t.Sequence[Reply]) -> None:
    """Every ``set_*`` command of a batch was accepted: a percentage setter echoes the value sent, the others print nothing.

    The UI's exit status is 0 even when a command is rejected, so each reply is looked at; the first
    rejected one raises with the daemon's own text.
    """
    for reply in replies:
        verb = reply.command.split()[0]
        if verb in PERCENT_COMMANDS:
            echoed = parse_percentage(reply)
            _check_echo(reply, echoed)
        elif verb == SET_DEFAULT_PRIORITY:
            # r580 prints nothing; an echo of the value sent (a number or its name) is taken too [U]
            sent = reply.command.split()[-1]
            if reply.lines and ' '.join(reply.lines).strip().lower() not in (sent, PRIORITY_NAMES.get(int(sent), sent)):
                raise ControlCommandError('the MPS control daemon rejected %r: %s' % (reply.command, reply.text))
        elif verb.startswith('set_'):
            expect_silent(reply)
        elif verb == SM_PARTITION and reply.command.split()[1:2] == ['add']:
            if partition_created(reply) is None:
                raise ControlCommandError('the MPS control daemon rejected %r: %s' % (reply.command, reply.text or '(no output)'))
        elif verb == SM_PARTITION:
            # rm prints nothing on success [I]; a refusal names the partition (in use, not found)
            expect_silent(reply)


def _check_echo(reply: Reply, echoed: float) -> None:
    """A percentage setter echoes the value in force (``%.1f``): the value sent, unless the daemon refused it - a real
    r580 daemon refuses ``150`` or ``abc`` without an error text, printing the value it keeps."""
    try:
        sent = float(reply.command.split()[-1])
    except ValueError:
        sent = None
    if sent is None or abs(sent - echoed) > 0.051:
        raise ControlCommandError('the MPS control daemon rejected %r: it answered %s, the value it keeps' % (reply.command, reply.text))


def parse_pids(reply: Reply) -> t.List[int]:
    """Parse a list of pids (one per line, or whitespace separated)."""
    words = ' '.join(reply.lines).split()
    if not all(word.isdigit() for word in words):
        raise ControlCommandError('the MPS control daemon rejected %r: %s' % (reply.command, reply.text))
    return [int(word) for word in words]
