# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Say, in a few lines, which task of an ansible-playbook or molecule log failed and why.

CI keeps only the tail of a run's output, and molecule's tail is its scenario recap: "verify: Failed" with no task.
This reads the whole log (color codes and molecule's box drawing stripped) and prints, for the last failure that was
not ignored or rescued, the play, the task and the first lines of its message - short enough to stay in the tail.

usage: failed-task.py LOG [--lines N]
"""
from __future__ import annotations

import re
import sys

ANSI = re.compile(r'\x1b\[[0-9;?]*[A-Za-z]')
# molecule 26 draws a box around each step's output: a leading "│" (or "|") with spaces.
BOX = re.compile(r'^\s*[\u2502|]\s?')
FAILURE = re.compile(r'^(fatal|failed): \[')
HEADER = re.compile(r'^(PLAY|TASK|RUNNING HANDLER) \[(.*)')
# An error of ansible-playbook itself (a playbook that does not parse, a missing role): no task ran.
ERROR = re.compile(r'^\[ERROR\]: ')


def _lines(text: str) -> list[str]:
    return [BOX.sub('', ANSI.sub('', line)).rstrip() for line in text.splitlines()]


def _header(lines: list[str], index: int) -> str:
    """A PLAY/TASK header may be folded over two lines by molecule's box: join until its closing bracket."""
    text = lines[index]
    follow = index + 1
    while ']' not in text and follow < len(lines) and follow < index + 4:
        text += ' ' + lines[follow].strip()
        follow += 1
    return re.sub(r'\]\s*\**\s*$', ']', HEADER.sub(r'\1 [\2', text)).strip(' *')


def digest(text: str, limit: int = 12) -> list[str]:
    lines = _lines(text)
    play = task = ''
    found: list[str] = []
    for index, line in enumerate(lines):
        header = HEADER.match(line)
        if header:
            if header.group(1) == 'PLAY' and not line.startswith('PLAY RECAP'):
                play = _header(lines, index)
            elif header.group(1) != 'PLAY':
                task = _header(lines, index)
            continue
        if not FAILURE.match(line):
            continue
        message = [line]
        for follow in lines[index + 1:]:
            if not follow.strip() or HEADER.match(follow) or FAILURE.match(follow) or follow == '...ignoring':
                break
            message.append(follow)
        # An ignored failure says so after the task's last result (a loop's items fail one after another).
        rest = lines[index + 1:]
        end = next((n for n, follow in enumerate(rest) if HEADER.match(follow)), len(rest))
        if '...ignoring' in rest[:end]:
            continue
        found = [play, task] + message
    if not found:
        return _error(lines, limit)
    body = found[2:]
    if len(body) > limit:
        body = body[:limit] + ['... (%d more lines in the log)' % (len(body) - limit)]
    return ['the last failed task:', '  ' + found[0], '  ' + found[1]] + ['  ' + line[:400] for line in body]


def _error(lines: list[str], limit: int) -> list[str]:
    """Where no task failed: the last error ansible-playbook itself printed, with what follows it (the file, the line)."""
    starts = [index for index, line in enumerate(lines) if ERROR.match(line)]
    if not starts:
        return []
    body = []
    for line in lines[starts[-1]:]:
        if line.lstrip().startswith(('\u2514', 'CRITICAL', 'ERROR ', 'INFO ', 'WARNING ')):
            break  # the end of molecule's box, or molecule's own next line
        if line.strip():
            body.append(line)
    if len(body) > limit:
        body = body[:limit] + ['... (%d more lines in the log)' % (len(body) - limit)]
    return ['no task failed; ansible-playbook said:'] + ['  ' + line[:400] for line in body]


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith('-'):
        sys.exit(__doc__)
    limit = int(argv[argv.index('--lines') + 1]) if '--lines' in argv else 12
    with open(argv[0], encoding='utf-8', errors='replace') as log:
        out = digest(log.read(), limit)
    print('\n'.join(out) if out else 'failed-task.py: no failed task in %s' % argv[0])
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
