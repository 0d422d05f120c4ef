# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Client of the MPS control UI (``nvidia-cuda-mps-control`` with no arguments).

One UI process carries a whole batch: the UI reads newline-separated commands until EOF and prints
the replies in order. The exit status is 0 whenever the daemon was reached, even when a command
was rejected, so replies are parsed, never trusted from the exit status.

Replies carry no delimiters and some commands print nothing, one line, or a variable number of
lines (and the text of an error, or of an unset value, is undocumented). To split a batch's output
reliably, ``get_default_active_thread_percentage`` - which always prints exactly one ``%.1f``
number - is inserted after every command whose reply is not itself such a number. Nothing else the
UI prints looks like ``\\d+\\.\\d``, so those lines delimit the replies. A percentage query for
a server pid may fail with any text or none; ``ps`` (whose header is never a percentage) fences it.
"""

from __future__ import annotations

import os
import re
import subprocess
import typing as t
from dataclasses import dataclass

from .._errors import ControlBinaryError, DaemonNotRunningError, DaemonTimeoutError

NOT_RUNNING_TEXT = 'Cannot find MPS control daemon process'
SENTINEL = 'get_default_active_thread_percentage'
# Commands whose successful reply is exactly one %.1f percentage line.
PERCENT_COMMANDS = frozenset((
    'get_default_active_thread_percentage',
    'set_default_active_thread_percentage',
    'get_active_thread_percentage',
    'set_active_thread_percentage',
))
PERCENT_LINE = re.compile(r'\d+\.\d+')
# Sent after a per-server percentage query that may fail (the pid may not be a server): its reply
# always starts with a header line that is not a percentage, so an empty error reply cannot be
# mistaken for the sentinel's percentage.
FENCE = 'ps'
# The first words of the fence's reply: NVIDIA's documented ps header. The real r580 daemon pads its columns
# (``PID       ID        SERVER         DEVICE ...``, ../gpu-evidence probe.txt), so words are compared, not text.
FENCE_HEADER = 'PID ID SERVER'
_FENCE_WORDS = FENCE_HEADER.split()


@dataclass(frozen=True)
class Reply:
    """The reply lines of one command of a batch."""

    command: str
    lines: t.Tuple[str, ...]

    @property
    def text(self) -> str:
        return '\n'.join(self.lines)


def _is_percent(cmd: str) -> bool:
    return cmd.split()[0] in PERCENT_COMMANDS


def _may_fail_percent(cmd: str) -> bool:
    """A percentage query naming a server pid: the pid may not be a server (any more)."""
    return _is_percent(cmd) and len(cmd.split()) > 1


def _is_fence_header(line: str) -> bool:
    return line.split()[:len(_FENCE_WORDS)] == _FENCE_WORDS


def _is_percent_line(line: str) -> bool:
    return bool(PERCENT_LINE.fullmatch(line))


def batch_text(commands: t.Sequence[str]) -> str:
    """The UI's stdin for ``commands``: each reply framed so that it can be split reliably.

    After every command but the last comes the sentinel (``get_default_active_thread_percentage``,
    one ``%.1f`` line), except after a pid-less percentage query, whose reply is itself one such
    line. A percentage query naming a pid is followed by the fence and then the sentinel: whether it
    prints a percentage, an error text or nothing, the next percentage-looking line after the fence
    is the sentinel.
    """
    sent: t.List[str] = []
    for index, cmd in enumerate(commands):
        sent.append(cmd)
        if index == len(commands) - 1:
            break
        if _may_fail_percent(cmd):
            sent.append(FENCE)
        if not _is_percent(cmd) or _may_fail_percent(cmd):
            sent.append(SENTINEL)
    return '\n'.join(sent)


def split_replies(commands: t.Sequence[str], lines: t.Sequence[str]) -> t.List[Reply]:
    """Split the UI's output (non-blank lines, stripped) for a batch framed by :func:`batch_text`.

    The reply of a failed percentage query ends before the fence's header, so that the daemon's error
    text is all an error message shows.
    """
    replies = []
    pos = 0
    for index, cmd in enumerate(commands):
        if index == len(commands) - 1:
            replies.append(Reply(cmd, tuple(lines[pos:])))
            pos = len(lines)
            break
        if _is_percent(cmd) and not _may_fail_percent(cmd):
            replies.append(Reply(cmd, tuple(lines[pos:pos + 1])))
            pos += 1
            continue
        value: t.Optional[t.Tuple[str, ...]] = None
        if _may_fail_percent(cmd) and pos < len(lines) and _is_percent_line(lines[pos]):
            value = (lines[pos],)
            pos += 1
        end = pos
        while end < len(lines) and not _is_percent_line(lines[end]):
            end += 1
        if end == len(lines):
            raise ControlBinaryError('unexpected reply from the MPS control UI: no delimiter after %r' % cmd,
                                     stdout='\n'.join(lines))
        text = lines[pos:end]
        if value is None and _may_fail_percent(cmd):
            header = next((n for n, line in enumerate(text) if _is_fence_header(line)), len(text))
            text = text[:header]
        replies.append(Reply(cmd, value if value is not None else tuple(text)))
        pos = end + 1
    return replies


def control_env(base: t.Mapping[str, str], pipe_dir: t.Optional[str] = None, log_dir: t.Optional[str] = None) -> t.Dict[str, str]:
    """The environment of a control binary we run: the caller's, less every ``CUDA_MPS_*`` variable of its own and
    ``NVML_MPS_DEVICE_ENUMERATION``, with the pipe and log directories we mean.

    A caller's ``CUDA_MPS_PROTOCOL_VERSION``, ``CUDA_MPS_LOG_DIRECTORY`` or client limits must never reach a control
    command: every invocation follows the running daemon's protocol (mps-v3-reference.md), and the UI of one resource
    must not be pointed at another's directories. ``NVML_MPS_DEVICE_ENUMERATION`` would change what NVML enumerates
    for whatever the UI starts.
    """
    env = {name: value for name, value in base.items()
           if not name.startswith('CUDA_MPS_') and name != 'NVML_MPS_DEVICE_ENUMERATION'}
    if pipe_dir:
        env['CUDA_MPS_PIPE_DIRECTORY'] = pipe_dir
    if log_dir:
        env['CUDA_MPS_LOG_DIRECTORY'] = log_dir
    return env


class ControlClient:
    """Talks to the control daemon of one pipe directory, one UI process per batch."""

    def __init__(self, binary: str, pipe_dir: str, timeout: float, log_dir: t.Optional[str] = None,
                 base_env: t.Optional[t.Mapping[str, str]] = None) -> None:
        self.binary = binary
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.timeout = timeout
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.processes = 0

    def _env(self) -> t.Dict[str, str]:
        return control_env(self.base_env, self.pipe_dir, self.log_dir)

    def run_raw(self, stdin_text: str) -> t.Tuple[int, str, str]:
        """Run one UI process with ``stdin_text``; return (rc, stdout, stderr)."""
        self.processes += 1
        try:
            proc = subprocess.run(  # pylint: disable=subprocess-run-check
                [self.binary], input=stdin_text, capture_output=True, text=True, errors='replace', env=self._env(),
                timeout=self.timeout, close_fds=True)
        except subprocess.TimeoutExpired as exc:
            raise DaemonTimeoutError(
                'the MPS control daemon on %s did not answer within %ss%s' % (
                    self.pipe_dir, self.timeout, self._log_hint()),
                pipe_dir=self.pipe_dir) from exc
        except OSError as exc:
            raise ControlBinaryError('cannot run %s: %s' % (self.binary, exc), control_binary=self.binary) from exc
        return proc.returncode, proc.stdout, proc.stderr

    def argv(self, words: t.Sequence[str]) -> t.Tuple[int, str]:
        """One v3 command given as arguments (``namespace list --server=s``; ``-q``): (exit status, its output). A daemon
        that is not there raises; a refusal is the caller's to read (v3 prints ``Error: ...`` and exits 1 [I])."""
        self.processes += 1
        try:
            proc = subprocess.run(  # pylint: disable=subprocess-run-check
                [self.binary] + list(words), stdin=subprocess.DEVNULL, capture_output=True, text=True, errors='replace',
                env=self._env(), timeout=self.timeout, close_fds=True)
        except subprocess.TimeoutExpired as exc:
            raise DaemonTimeoutError('the MPS control daemon on %s did not answer %s within %ss%s' % (
                self.pipe_dir, ' '.join(words), self.timeout, self._log_hint()), pipe_dir=self.pipe_dir) from exc
        except OSError as exc:
            raise ControlBinaryError('cannot run %s: %s' % (self.binary, exc), control_binary=self.binary) from exc
        if NOT_RUNNING_TEXT in proc.stdout or NOT_RUNNING_TEXT in proc.stderr:
            raise DaemonNotRunningError('no MPS control daemon answers on %s' % self.pipe_dir, pipe_dir=self.pipe_dir)
        return proc.returncode, (proc.stdout + proc.stderr).strip()

    def _log_hint(self) -> str:
        if self.log_dir:
            return ' (see %s)' % os.path.join(self.log_dir, 'control.log')
        return ''

    def batch(self, commands: t.Sequence[str]) -> t.List[Reply]:
        """Send ``commands`` in one UI process; return one :class:`Reply` per command."""
        if not commands:
            return []
        rc, stdout, stderr = self.run_raw(batch_text(commands))
        if NOT_RUNNING_TEXT in stdout or NOT_RUNNING_TEXT in stderr:
            raise DaemonNotRunningError('no MPS control daemon answers on %s' % self.pipe_dir, pipe_dir=self.pipe_dir)
        if rc != 0:
            raise ControlBinaryError(
                '%s exited with status %d%s' % (self.binary, rc, self._log_hint()),
                rc=rc, stdout=stdout, stderr=stderr)
        lines = [line.strip() for line in stdout.splitlines() if line.strip()]
        try:
            return split_replies(commands, lines)
        except ControlBinaryError as exc:
            raise ControlBinaryError('%s from %s: is it really nvidia-cuda-mps-control?%s' % (exc.msg, self.binary, self._log_hint()),
                                     **dict(exc.details, control_binary=self.binary)) from exc
