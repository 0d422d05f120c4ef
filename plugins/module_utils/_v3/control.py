# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The v3 words this collection sends a daemon it started with ``-p 3``: its lists, the live namespace changes, ``-q``.

Every call is one UI process with the command as arguments and the environment the legacy calls get (the pipe and log
directories we mean, nothing of the caller's ``CUDA_MPS_*``): a running daemon decides the protocol [ref 1.1].
"""

from __future__ import annotations

import time
import typing as t

from .._errors import ControlCommandError, DaemonNotRunningError, DaemonTimeoutError, MpsError
from .readout import V3Readout, client_list, namespace_list, parse_clients, parse_namespaces

# How long a daemon that answers may go on not listing the resource's server before its start is failed.
SERVER_GRACE = 2.0


def _not_found(text: str, server: str) -> bool:
    return 'not found' in text.lower() and server in text


def _refused(client: t.Any, words: t.Sequence[str], rc: int, text: str) -> ControlCommandError:
    return ControlCommandError('the MPS v3 daemon on %s refused %s: %s' % (client.pipe_dir, ' '.join(words), text or 'status %d' % rc),
                               rc=rc, stdout=text)


def read_v3(client: t.Any, server: str) -> V3Readout:
    """The resource's server as the daemon lists it (two UI processes)."""
    rc, text = client.argv(namespace_list(server))
    if rc != 0:
        if _not_found(text, server):
            return V3Readout(server, found=False)
        raise _refused(client, namespace_list(server), rc, text)
    status, namespaces, unreadable = parse_namespaces(server, text)
    if not namespaces:
        return V3Readout(server, found=False)
    rc, text = client.argv(client_list(server))
    if rc != 0:
        raise _refused(client, client_list(server), rc, text)
    return V3Readout(server, found=True, status=status, namespaces=namespaces, unreadable=unreadable,
                     clients=parse_clients(server, text))


def send(client: t.Any, words: t.Sequence[str], name: str) -> None:
    """One live change; a refusal raises with the daemon's words."""
    rc, text = client.argv(words)
    if rc != 0:
        raise ControlCommandError('the MPS v3 daemon of %s refused "%s": %s' % (name, ' '.join(words), text or 'status %d' % rc),
                                  rc=rc, stdout=text)


def wait_server(client: t.Any, server: str, timeout: float, sleep: t.Callable[[float], None], see_log: str) -> V3Readout:
    """Poll with backoff until the daemon lists ``server``; a daemon that answers without it applied its file without it."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    missing_since: t.Optional[float] = None
    while True:
        try:
            seen = read_v3(client, server)
        except DaemonNotRunningError:
            seen = None
        if seen is not None and seen.ready:
            return seen
        if seen is not None and not seen.found:
            # whether -d returns before the file is applied is unknown [U]: a short grace, not the whole timeout
            missing_since = time.monotonic() if missing_since is None else missing_since
        if missing_since is not None and time.monotonic() - missing_since > SERVER_GRACE:
            raise MpsError('the MPS v3 control daemon on %s answers, but its server %s is not in its lists: its -a file was '
                           'refused or the server exited (a GPU the host lacks?) - it was left running; see %s' % (
                               client.pipe_dir, server, see_log))
        if time.monotonic() + delay > deadline:
            raise DaemonTimeoutError('the MPS v3 control daemon on %s did not start answering within %ss%s (see %s)' % (
                client.pipe_dir, timeout, '' if seen is None else ': its server %s is %s, not Ready' % (server, seen.status or 'listed'),
                see_log))
        sleep(delay)
        delay = min(delay * 2, 0.25)


def wait_namespace_idle(client: t.Any, server: str, namespace: str, timeout: float, sleep: t.Callable[[float], None],
                        name: str) -> None:
    """busy=wait: until no client is attached to ``namespace`` (the client list polled), or a refusal after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        rc, text = client.argv(client_list(server))
        attached = [pid for pid, where in parse_clients(server, text if rc == 0 else '') if where == namespace]
        if rc == 0 and not attached:
            return
        if time.monotonic() >= deadline:
            raise MpsError('busy: namespace %s of server %s (%s) still has %d attached client(s) after %ds - %s; its change was '
                           'not made (busy=wait)' % (namespace, server, name, len(attached), timeout,
                                                     ', '.join('pid %d' % pid for pid in attached) or 'the client list failed'))
        sleep(0.5)
