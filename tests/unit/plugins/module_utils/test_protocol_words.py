# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The control protocol's words are spelled in _protocol/ only: every other file builds commands through it."""
from __future__ import annotations

import re
from pathlib import Path

MODULE_UTILS = Path(__file__).resolve().parents[4] / 'plugins' / 'module_utils'
# Every command of nvidia-cuda-mps-control's UI, as a string literal of its own or at the start of one.
WORDS = re.compile(r'''['"](?:quit|ps|shutdown|start_server|lsserver|terminate_client|get_server_list|get_client_list|'''
                   r'''get_device_client_list|[gs]et_(?:default_)?(?:active_thread_percentage|device_pinned_mem_limit)|'''
                   r'''set_default_client_priority|get_default_client_priority)\b''')


def protocol_words(path: Path):
    return [(path.relative_to(MODULE_UTILS).as_posix(), number, line.strip())
            for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1) if WORDS.search(line)]


def test_protocol_words_live_in_protocol_only():
    outside = [hit for path in sorted(MODULE_UTILS.rglob('*.py')) if path.parent.name != '_protocol'
               for hit in protocol_words(path)]
    assert outside == []


def test_the_count_sees_the_words_where_they_are():
    inside = [hit for path in sorted((MODULE_UTILS / '_protocol').glob('*.py')) for hit in protocol_words(path)]
    assert len(inside) >= 8, inside  # every builder of commands.py and every read of state.py
