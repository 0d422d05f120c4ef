# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a guide quotes of a real engine is what the engines test printed.

A guide marks such a quote with ``.. docs-test: engines <name>`` on the line before its ``.. code-block:: text``
(tests/docs/test_documented_commands.py knows the tag); the engines test ``<name>`` passes everything it printed to
:func:`check_quoted`, which requires every such block to be found in it: whitespace collapsed (a guide wraps lines),
``...`` standing for any text, and the test's own directories cut from what was printed (``<work>/host/run/nvidia/mps``
reads ``/run/nvidia/mps``, as on a real host). A guide without any block for the name fails too.
"""
from __future__ import annotations

import os
import re
from typing import List, Sequence, Tuple

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
TAG = re.compile(r'^\s*\.\. docs-test: engines (?P<name>\S+)\s*$')


def quoted_blocks(guide: str, name: str) -> List[Tuple[int, str]]:
    """(line, text) of each text block of ``guide`` tagged ``engines <name>``."""
    with open(os.path.join(REPO, guide), encoding='utf-8') as handle:
        lines = handle.read().split('\n')
    found = []
    for number, line in enumerate(lines):
        tag = TAG.match(line)
        if not tag or tag.group('name') != name:
            continue
        start = next(i for i in range(number + 1, len(lines)) if lines[i].strip())
        assert lines[start].strip().startswith('.. code-block::'), '%s:%d: the tag must precede a code block' % (guide, number + 1)
        body = []
        for text in lines[start + 1:]:
            if text.strip() and not text.startswith('   '):
                break
            body.append(text.strip())
        found.append((number + 1, ' '.join(word for word in body if word)))
    return found


def _collapse(text: str) -> str:
    return re.sub(r'\s+', ' ', text).strip()


def check_quoted(guide: str, name: str, printed: str, cut: Sequence[str] = ()) -> int:
    """Every block of ``guide`` tagged ``engines <name>`` is in ``printed`` (``cut`` removed first); how many there are."""
    for prefix in sorted(cut, key=len, reverse=True):
        printed = printed.replace(prefix, '')
    haystack = _collapse(printed)
    blocks = quoted_blocks(guide, name)
    assert blocks, '%s quotes nothing tagged "engines %s"' % (guide, name)
    missing = []
    for line, text in blocks:
        regex = '.*?'.join(re.escape(part) for part in _collapse(text).split('...'))
        if not re.search(regex.replace(re.escape(' '), r'\s+'), haystack):
            missing.append('%s:%d: %s' % (guide, line, text))
    assert not missing, 'quoted but not printed by the engines test:\n' + '\n'.join(missing) + '\n--- printed:\n' + printed[-4000:]
    return len(blocks)
